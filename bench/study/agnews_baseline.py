"""AG_News baseline: TF-IDF features + a linear SVM, the model a practitioner would try first.

It reads the same files through the same parser as ``taskformer run agnews`` and trains on the same
rows the Transformer trains on (train minus the seeded validation split), then scores the official
test set. scikit-learn is a bench-only dependency (``pip install taskformer[bench]``).

    python bench/study/agnews_baseline.py [--data-dir DIR] [--val-fraction 0.05] [--seed 0]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.metrics import accuracy_score, f1_score
from sklearn.pipeline import make_pipeline
from sklearn.svm import LinearSVC

from taskformer.core.errors import TaskformerError
from taskformer.tasks.agnews import read_csv, split_val

DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "ag_news"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help="folder with train.csv[.gz] and test.csv[.gz]")
    ap.add_argument("--val-fraction", type=float, default=0.05,
                    help="rows held out of train exactly as taskformer does (0: train on every row)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the validation split (taskformer's train.seed)")
    args = ap.parse_args()

    started = time.perf_counter()
    try:
        train, test = read_csv(args.data_dir, "train.csv"), read_csv(args.data_dir, "test.csv")
    except TaskformerError as e:
        sys.exit(f"Error: {e}")
    if args.val_fraction > 0:
        train, _ = split_val(train, args.val_fraction, args.seed)
    fit_start = time.perf_counter()
    model = make_pipeline(TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=1), LinearSVC(C=1.0))
    model.fit([s for s, _ in train], [t for _, t in train])
    pred = model.predict([s for s, _ in test])
    gold = [t for _, t in test]
    done = time.perf_counter()
    print(f"train rows {len(train)}, test rows {len(test)}")
    print(f"accuracy  {100 * accuracy_score(gold, pred):.2f}")
    print(f"macro_f1  {100 * f1_score(gold, pred, average='macro'):.2f}")
    print(f"wall time {done - fit_start:.2f} s fitting and scoring, {done - started:.2f} s with reading the files")


if __name__ == "__main__":
    main()
