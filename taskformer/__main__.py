from taskformer.plugins.cli import main

main(prog_name="taskformer")
