from taskformer.app.cli import main

main(prog_name="taskformer")
