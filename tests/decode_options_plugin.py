"""Two small tasks for the decode-option tests, written as a plugin author would.

``echo`` (encoder-decoder) copies letters read from ``rows.tsv`` in ``--data-dir``; it has a decode
option of its own, ``repeat``, and its decoder says why it was called, so a test can see which
purpose every command, the API and the server give it. ``vote`` (encoder-only) names the more
frequent of two letters: a classifier, which has no search to set.
"""
import random
from dataclasses import dataclass

from taskformer import DecodeConfig, Task, TaskData, find_file, hookimpl, option, read_tsv, search, symbols


@dataclass
class Echo(DecodeConfig):
    repeat: int = option(1, "Write the output this many times.", at_least=1, at_most=3)


class EchoPlugin:
    @hookimpl
    def taskformer_tasks(self):
        return [Task(name="echo", description="Copy letters (a decode-options fixture)", metric="loss",
                     higher_is_better=False, decode_options=Echo,
                     defaults={"decode": {"strategy": "greedy", "max_len_a": 1.0, "max_len_b": 2}})]

    @hookimpl
    def taskformer_data(self, data_dir):
        rows = read_tsv(find_file(data_dir, "rows.tsv"))
        return TaskData(tokenizer=symbols(list("abcde")),
                        splits={"train": rows[:40], "val": rows[40:46], "test": rows[46:52]})

    @hookimpl
    def taskformer_decode(self, model, src, tokenizer, config, purpose):
        outputs = [" ".join([tokenizer.decode(ids)] * config.decode.repeat) for ids in search(model, src, config.decode)]
        return [f"{purpose}: {out}" for out in outputs]


def echo_rows(n: int = 52, seed: int = 0) -> str:
    """The text of ``rows.tsv``: ``n`` rows of letters and their copy."""
    rng = random.Random(seed)
    lines = [" ".join(rng.choice("abcde") for _ in range(rng.randint(2, 6))) for _ in range(n)]
    return "".join(f"{line}\t{line}\n" for line in lines)


class VotePlugin:
    @hookimpl
    def taskformer_tasks(self):
        return [Task(name="vote", description="The more frequent letter (a classifier fixture)",
                     variant="encoder-only", metric="loss", higher_is_better=False)]

    @hookimpl
    def taskformer_data(self, config):
        rng = random.Random(config.train.seed)
        texts = [" ".join(rng.choice("ab") for _ in range(rng.choice((3, 5)))) for _ in range(52)]
        rows = [(t, "a" if t.count("a") > t.count("b") else "b") for t in texts]
        return TaskData(tokenizer=symbols(list("ab")), labels=["a", "b"],
                        splits={"train": rows[:40], "val": rows[40:46], "test": rows[46:52]})


PLUGINS = {"echo-fixture": EchoPlugin(), "vote-fixture": VotePlugin()}
