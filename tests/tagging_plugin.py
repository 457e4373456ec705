"""A tagging task for the tests: a tiny truecaser, written the way a plugin author would.

The input is a lower-cased sentence; the target tags each word ``lower``, ``title`` (names, and the
first word of a sentence) or ``upper`` (acronyms). A word's casing depends on the word itself and
on its place, so the encoder needs its context, and the BPE tokenizer splits rarer words into
several tokens, so the core's word alignment is exercised in training and in decoding alike. The
normalize hook lower-cases what ``predict`` is given and drops punctuation, as the data hook's
sources are; ``predict`` still pairs each tag with the word as the user wrote it.
"""
import random

from taskformer import Task, TaskData, hookimpl, subword

LOWER = ("the a to in and with from at of on city river old new small big bridge train saw met visited "
         "flew walked near after before").split()
NAMES = "anna tom maria berlin paris london rome oslo".split()
ACRONYMS = "nasa bbc ibm eu un".split()
TAGS = ["lower", "title", "upper"]  # the most common first: a word beyond model.max_len gets it

TASK = Task(name="truecase", description="Tag each word's casing (a tagging fixture)", variant="tagging",
            metric="token_accuracy",
            defaults={"model": {"d_model": 64, "n_heads": 4, "enc_layers": 2, "d_ff": 128, "dropout": 0.0,
                                "max_len": 64},
                      "train": {"epochs": 3, "max_tokens": 512, "lr": 3e-3, "warmup": 30, "label_smoothing": 0.0}})


@hookimpl
def taskformer_tasks():
    return [TASK]


def casing(word: str) -> str:
    return "upper" if word in ACRONYMS else "title" if word in NAMES else "lower"


def sentences(rng: random.Random, n: int) -> list[tuple[str, str]]:
    rows = []
    for _ in range(n):
        words = [rng.choice(NAMES if rng.random() < 0.2 else ACRONYMS if rng.random() < 0.1 else LOWER)
                 for _ in range(rng.randint(3, 9))]
        tags = [casing(w) for w in words]
        tags[0] = "upper" if tags[0] == "upper" else "title"  # a sentence starts with a capital
        rows.append((" ".join(words), " ".join(tags)))
    return rows


@hookimpl
def taskformer_normalize(text):
    # The model saw lower-cased words without punctuation; one word stays one word, so predict's
    # word/tag pairs keep the user's words ("London." with its full stop).
    return " ".join(word.strip(".,;:!?") or word for word in text.lower().split())


@hookimpl
def taskformer_data(config):
    rng = random.Random(config.train.seed)
    train = sentences(rng, 1500)
    # A vocabulary smaller than the word list: rarer words are split into pieces.
    tokenizer = subword([s for s, _ in train], vocab_size=60, min_frequency=1)
    return TaskData(tokenizer=tokenizer, splits={"train": train, "val": sentences(rng, 100),
                                                 "test": sentences(rng, 100)}, labels=TAGS)
