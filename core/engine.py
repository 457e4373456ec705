"""The one training engine: every task trains through :class:`Trainer`, which knows no task.

What it does, in the paper's terms: Adam(W) with the warm-up schedule of section 5.3 (optionally
ending in a linear cool-down to zero, ``train.cooldown``), label-smoothed cross-entropy (section
5.4) that ignores padding, gradient clipping, and batches of roughly equal *token* counts built
from length buckets. It evaluates through a callback the task layer supplies, keeps the best
weights by the task's metric, and writes resumable checkpoints. On CPU a seeded run is
deterministic, including after ``--resume``.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.nn.parallel import DistributedDataParallel

from taskformer.core import checkpoint as ckpt
from taskformer.core import clock, cores, precision
from taskformer.core.data import Batch, Encoded, Indices, collate, token_batches
from taskformer.core.errors import TaskformerError
from taskformer.core.loss import batch_loss, target_count, teacher_forced
from taskformer.core.model import Ensemble, SequenceModel, Transformer
from taskformer.core.train_config import TrainConfig


def lr_factor(step: int, warmup: int, schedule: str = "inverse_sqrt", total: int = 0) -> float:
    """The learning rate of update ``step`` (from 1) as a fraction of ``train.lr``.

    Linear warm-up to 1, then either the paper's decay with the inverse square root of the step
    (eq. 3, :func:`inverse_sqrt`), which suits open-ended training, or a linear decay that reaches
    zero after update ``total``: with a known number of updates it lets a short run settle instead
    of ending at a still-high rate.
    """
    step = max(step, 1)
    if schedule == "linear" and total > warmup and step >= warmup:
        return max(total - step + 1, 0) / (total - warmup + 1)
    return inverse_sqrt(step, warmup)


def forked_random(device: torch.device):
    """torch's random generators (the CPU's and ``device``'s GPU's) forked: what runs inside moves neither."""
    gpus = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    return torch.random.fork_rng(devices=gpus)


def inverse_sqrt(position: float, warmup: float) -> float:
    """The paper's schedule (eq. 3) as a fraction of its peak at ``position``, counted in updates or in
    seconds of training alike: a linear warm-up over ``warmup``, then the inverse square root of the
    position; 1 throughout without a warm-up."""
    if warmup <= 0:
        return 1.0
    return position / warmup if position < warmup else math.sqrt(warmup / position)


def epoch_updates(cfg: TrainConfig, lengths: Indices, epoch: int = 0, rank: int = 0,
                  world: int = 1) -> list[list[Batch]]:
    """Rank ``rank``'s updates in epoch ``epoch``: each a list of ``accumulate`` batches of indices.

    The epoch's batches are cut to a multiple of ``world * accumulate`` so that every rank makes
    the same number of updates; update ``k`` of rank ``r`` then holds global batch
    ``(k * world + r) * accumulate + j`` -- the same tokens a single process accumulates.
    """
    acc = cfg.accumulate
    batches = token_batches(lengths, cfg.max_tokens, seed=cfg.seed * 100_003 + epoch)
    per_update = world * acc
    batches = batches[: len(batches) // per_update * per_update] or batches[:per_update]
    groups = [batches[i : i + acc] for i in range(0, len(batches), acc)]
    return groups[rank::world]


def planned_updates(cfg: TrainConfig, per_epoch: int) -> int:
    """The updates ``cfg`` plans with ``per_epoch`` updates an epoch: the fewer of its epochs and
    ``max_steps``; 0 where neither is set (a time limit is the budget)."""
    return min((n for n in (cfg.epochs * per_epoch, cfg.max_steps) if n), default=0)


def patience_reason(patience: int) -> str:
    """The stop reason of ``train.patience``, in the words the run reports (and the app recognises)."""
    return f"no improvement in {patience} evaluations (patience)"


@dataclass
class TrainState:
    """Where training stands: saved as each checkpoint's ``state.json``, restored by a resume."""

    step: int = 0  # updates made
    epoch: int = 0  # epochs completed
    batch: int = 0  # updates made in the current epoch
    best: list[float] | None = None  # the best evaluation's (score, -loss) so far, higher is better
    best_step: int = 0
    best_weights: list[int] = field(default_factory=list)  # the steps whose (averaged) weights are model.safetensors
    stale: int = 0  # evaluations since the last improvement
    elapsed: float = 0.0  # seconds of training and validation, over every attempt
    tokens: int = 0  # target tokens trained on
    stopped: str = ""  # why training stopped early ("": it did not)
    evaluated_at: int = -1  # the step of the last evaluation
    # where the final decay began: [the first update whose rate falls, seconds of training then, and the
    # schedule's factor then where it follows the clock (train.warmup_share)]
    decay: list[float] = field(default_factory=list)
    clock: dict = field(default_factory=dict)  # what the time limit's clock keeps back, and the pace it follows
    resumed: list[dict] = field(default_factory=list)  # each resume: the step and epoch it went on from, and why it stopped
    threads: list[dict] = field(default_factory=list)  # each change of torch's threads on a busy machine (core/cores.py)

    @classmethod
    def of(cls, saved: dict[str, Any]) -> TrainState:
        """The state a checkpoint saved (the keys this version knows; those it lacks keep their start)."""
        return cls(**{f.name: saved[f.name] for f in fields(cls) if f.name in saved})


class Stop(Exception):
    """Raised inside the loop to end training early (time limit, patience, a signal)."""


class EventLog(Protocol):
    """Where a trainer records its events (the application's run directory keeps them)."""

    def append(self, event: dict) -> None: ...

    def drop_after(self, step: int) -> None:
        """Forget the events logged after ``step``, the checkpoint a resumed run starts from."""


class Trainer:
    """Trains ``model`` on ``train``; ``evaluate()`` returns the validation metrics dict.

    ``select`` is ``(metric name, higher is better)``. ``on_event`` receives every log record
    (also appended to ``events``, where given) so the caller can drive a progress display. With
    ``average_last`` the weights of each evaluation are kept as well, and the average of the last
    ones competes for the best like any checkpoint (section 6.1 of the paper averages the last 5).
    ``stamp`` goes into the metadata of the best weights and every checkpoint (the runner binds
    them to the run's task and tokenizer that way). ``threads``, where given, sets torch's threads to
    the cores other processes leave free while it trains (:mod:`taskformer.core.cores`).
    """

    def __init__(self, model: Transformer | Ensemble, cfg: TrainConfig, train: Encoded, evaluate: Callable[[], dict],
                 select: tuple[str, bool], run_dir: Path, device: torch.device,
                 on_event: Callable[[dict], None] = lambda e: None, shard: tuple[int, int] = (0, 1),
                 stamp: dict[str, str] | None = None, events: EventLog | None = None,
                 threads: cores.Threads | None = None):
        self.model, self.cfg, self.train_data, self.evaluate = model, cfg, train, evaluate
        self.threads = threads
        self.stamp, self.events = stamp, events
        self.metric, self.higher = select
        self.run_dir, self.device, self.on_event = Path(run_dir), device, on_event
        self.rank, self.world = shard
        # what forward/backward run through: the model itself, or its DDP wrapper
        self.net: SequenceModel | DistributedDataParallel = model
        if self.world > 1:
            self.net = DistributedDataParallel(model)
        decay = [p for p in model.parameters() if p.dim() > 1]
        no_decay = [p for p in model.parameters() if p.dim() <= 1]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9, fused=True)  # fused: one kernel per step, CPU and GPU
        self.total_steps = cfg.max_steps  # the planned number of updates, known once fit() sees the data
        self.state = TrainState()
        self.share = 1.0  # of the scheduled rate, the share the final decay leaves the next update
        self.timed_base: float | None = None  # the schedule's factor on the clock, where it follows the budget
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: self._rate_factor(s + 1))
        self.stop_reason = ""  # set from outside (signal handler) to stop after the current step
        self.clock: clock.Clock | None = None  # the time limit's clock, where one is given (fit)
        self.validating = False  # inside an evaluation: a signal handler may abandon it (nothing is saved then)

    # -- checkpoints -------------------------------------------------------------------------
    def check_weights(self) -> None:
        """Refuse to evaluate or save weights that hold NaN or infinity: they are never kept."""
        bad = ckpt.non_finite(self.model)
        if bad:
            raise TaskformerError(f"the weights became NaN or infinite ({bad}) by step {self.state.step}; "
                                  "nothing was saved from them and the best checkpoint so far is kept "
                                  "(try a lower train.lr)")

    def save(self) -> None:
        self.check_weights()
        if self.clock:  # a resumed run keeps back what this one kept
            self.state.clock = self.clock.state()
        if self.rank == 0:
            ckpt.save_training_state(self.run_dir / ckpt.CHECKPOINTS, self.state.step, self.model,
                                     self.optimizer, self.scheduler, asdict(self.state), self.cfg.keep_last, self.stamp)

    def resume(self) -> bool:
        """Continue from the newest checkpoint; events logged after it (by the lost process) are dropped."""
        path = ckpt.latest_training_state(self.run_dir / ckpt.CHECKPOINTS)
        if path is None:
            return False
        self.state = TrainState.of(ckpt.load_training_state(path, self.model, self.optimizer, self.scheduler))
        st, per_epoch = self.state, len(self.epoch_updates(self.train_data.lengths()))  # the same for every epoch
        beyond = bool(self.cfg.epochs) and st.epoch > self.cfg.epochs  # epochs 0: no cap
        if beyond or st.batch > per_epoch or st.step != st.epoch * per_epoch + st.batch:
            raise TaskformerError(f"{path / 'state.json'}: epoch {st.epoch}, batch {st.batch} and step {st.step} "
                                  f"do not agree with {self.cfg.epochs} epochs of {per_epoch} updates; the checkpoint "
                                  "is damaged")
        if self.rank == 0 and self.events:
            self.events.drop_after(self.state.step)
        st.resumed.append({"step": st.step, "epoch": st.epoch, "batch": st.batch,
                           "after": st.stopped or "a stop that saved no reason (a kill, say)"})
        self.on_event({"event": "resumed", **st.resumed[-1]})  # said, not logged: the log is the run's updates
        if self.rank == 0:  # weights of evaluations after the checkpoint would join the averages too early
            for step, later in ckpt.evaluated_weights(self.run_dir).items():
                if step > self.state.step:
                    later.unlink()
        return True

    def log(self, **event) -> None:
        event.setdefault("step", self.state.step)
        if self.rank == 0 and self.events:
            self.events.append(event)
        self.on_event(event)

    # -- the learning rate -------------------------------------------------------------------
    def _rate_factor(self, step: int) -> float:
        """``lr_factor`` of the schedule (held at the decay's first update once it began), times the decay's share."""
        if self.timed_base is not None:  # the schedule on the clock (train.warmup_share)
            return self.timed_base * self.share
        if self.state.decay and step >= self.state.decay[0]:
            step = int(self.state.decay[0])
        return lr_factor(step, self.cfg.warmup, self.cfg.schedule, self.total_steps) * self.share

    def _schedule_next(self) -> None:
        """Set the next update's learning rate: the schedule's, times the share the final decay leaves.

        A short run ends at a still-high learning rate, where the weights wander around a minimum
        (hence the gain of averaging them); letting the rate fall to zero over the last part of the
        run settles them (the warm-up, stable, decay schedule of Hu et al., 2024, "MiniCPM", and
        Hägele et al., 2024). The decay (``train.cooldown``) runs over the last share of the planned
        updates or, with a time limit, of the training *time*: the clock is asked after every update
        (:meth:`clock.Clock.decay`; rank 0's decides for all), so the rate reaches zero as the time
        runs out whatever the pace was before, and a resumed run (its training seconds are saved)
        decays as an uninterrupted one would. A ``linear`` schedule with no count of updates (no
        epoch cap or step limit under a time limit) decays over all the training time after its warm-up.
        With ``train.warmup_share`` the warm-up spans that share of the updates the whole budget buys
        (:meth:`clock.Clock.updates_in_budget`, asked after every update) and the paper's decay after it
        counts updates: a busy start's slow updates each get the rate an update gets at an even pace.
        """
        cfg, st, timer = self.cfg, self.state, self.clock if self.clock and self.clock.limit else None
        after_warmup = cfg.schedule == "linear" and not self.total_steps and timer is not None
        begins = after_warmup and not st.decay and st.step >= cfg.warmup
        if begins:
            st.decay = [st.step + 1, st.elapsed]
        share = clock.step_share(st.step, self.total_steps, cfg.cooldown)
        decays_by_time = timer is not None and bool(st.decay if after_warmup else cfg.cooldown)
        # the schedule on the clock (train.warmup_share), held where the final decay began as the count's is
        on_clock = timer is not None and bool(cfg.warmup_share) and cfg.schedule == "inverse_sqrt"
        held = on_clock and len(st.decay) > 2
        by_time = base = 1.0
        if timer and (decays_by_time or on_clock and not held):
            trained = st.elapsed
            figures = torch.tensor(  # rank 0's clock decides for every rank: one broadcast for both
                [timer.decay(trained, cfg.cooldown, st.decay[1] if after_warmup else None) if decays_by_time else 1.0,
                 inverse_sqrt(st.step + 1, cfg.warmup_share * timer.updates_in_budget(st.step)) if on_clock else 1.0],
                device=self.device)
            if self.world > 1:
                torch.distributed.broadcast(figures, src=0)
            by_time, base = figures.tolist()
        share = min(share, by_time)
        if share < 1 and not st.decay:
            st.decay, begins = [st.step + 1, st.elapsed], True
        if on_clock:
            self.timed_base = st.decay[2] if held else base
            if st.decay and not held:
                st.decay = [*st.decay[:2], base]
        self.share = share
        self.scheduler.step()
        if begins:
            over = {"seconds": round(max(timer.for_training() or 0.0, 0.0), 1)} if timer else \
                {"updates": self.total_steps - st.step}
            self.log(event="cooldown", after=st.step + 1, lr=self.scheduler.get_last_lr()[0], **over)

    # -- the loop ----------------------------------------------------------------------------
    def _evaluate(self) -> None:
        """Evaluate the weights (and with ``average_last``, the average of the last ones) and keep the best."""
        self.check_weights()
        self.state.evaluated_at = self.state.step
        self.validating = True
        try:
            improved = self._keep_if_best(self._validation())
            if self.cfg.average_last > 1:
                improved = self._evaluate_average() or improved
        finally:
            self.validating = False
        self.state.stale = 0 if improved else self.state.stale + 1
        self.net.train()

    def _validation(self) -> dict:
        """The evaluation callback's metrics, drawn from a forked random generator: whatever decodes
        (our decoder builds layers of its own, a runtime draws nothing), the updates after it draw the
        dropout they would have drawn."""
        with forked_random(self.device):
            return self.evaluate()

    def _keep_if_best(self, metrics: dict, averaged: list[int] | None = None) -> bool:
        """Log an evaluation of the model's current weights, which are the mean of those of the
        ``averaged`` steps if given; save them as model.safetensors if they are the best so far."""
        score = metrics.get(self.metric)
        if score is None or not math.isfinite(score):
            raise TaskformerError(f"evaluation returned no finite value for the selection metric {self.metric!r}")
        if not math.isfinite(metrics.get("loss", 0.0)):
            raise TaskformerError(f"validation loss became {metrics['loss']} at step {self.state.step}; these "
                                  "weights are not kept, the best checkpoint so far is kept (try a lower train.lr)")
        # Ties on the task metric (e.g. 100% exact match) go to the lower validation loss.
        key = (score if self.higher else -score, -metrics.get("loss", 0.0))
        best = self.state.best
        improved = best is None or key > tuple(best)
        if improved:
            st = self.state
            st.best, st.best_step, st.best_weights = list(key), st.step, averaged or [st.step]
            if self.rank == 0:
                ckpt.save_weights(self.model, self.run_dir / ckpt.WEIGHTS, self.stamp)
        self.log(event="eval", split="val", epoch=self.state.epoch, improved=improved,
                 **({"averaged": averaged} if averaged else {}), **metrics)
        return improved

    def _evaluate_average(self) -> bool:
        """Keep the weights just evaluated, evaluate the mean of the last ``average_last`` kept, then
        go back to the training weights (bit for bit: they are read back from their file)."""
        step = self.state.step
        if self.rank == 0:
            ckpt.keep_evaluated(self.model, self.run_dir, step, self.cfg.average_last)
        if self.world > 1:
            torch.distributed.barrier()  # every rank reads the files rank 0 wrote
        kept = ckpt.evaluated_weights(self.run_dir)
        if len(kept) < 2:
            return False
        ckpt.load_average(self.model, list(kept.values()))
        try:
            return self._keep_if_best(self._validation(), list(kept))
        finally:
            ckpt.load_weights(self.model, kept[step])

    def _step(self, micro: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, int]:
        """One optimizer update over ``micro``-batches (gradient accumulation) and, with DDP, all ranks.

        The loss is summed over every target token of the update and divided by their total count,
        so the update is the same however the tokens are split across micro-batches and processes.
        """
        count = sum(target_count(tgt, teacher_forced(self.model)) for _, tgt in micro)
        total = torch.tensor(float(count), device=self.device)
        if self.world > 1:
            torch.distributed.all_reduce(total)
        summed = torch.zeros((), device=self.device)
        for i, (src, tgt) in enumerate(micro):
            net, last = self.net, i == len(micro) - 1  # DDP syncs the gradients of the last micro-batch only
            accumulating = net.no_sync() if isinstance(net, DistributedDataParallel) and not last else nullcontext()
            attention = precision.steady_attention(self.device)
            with accumulating, precision.autocast(self.cfg.bf16, self.device), attention:
                loss, _ = batch_loss(self.net, src, tgt, self.cfg.label_smoothing)
            # DDP averages gradients over ranks; scaling by world turns that average into the global sum.
            (loss * self.world / total.clamp(min=1)).backward()
            summed += loss.detach().float()
        if self.world > 1:  # log the loss of the whole update, not just this rank's share
            torch.distributed.all_reduce(summed)
        if self.cfg.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip)
        self.optimizer.step()
        for weight in self.model.parameters():  # the fused step leaves the version counters as they were: moved
            torch.autograd.graph.increment_version(weight)  # here, every copy or runtime kept by them sees the update
        self.optimizer.zero_grad(set_to_none=True)
        value = float(summed) / max(float(total), 1.0)
        if not math.isfinite(value):
            raise TaskformerError(f"training loss became {value} at step {self.state.step + 1}; "
                                  "the best checkpoint so far is kept (try a lower train.lr)")
        return value, int(total)  # the whole update's target tokens, as the loss counts them

    def _stop_requested(self) -> str:
        """Why to stop now, agreed by every rank (one stopping alone would leave the others waiting)."""
        cfg, st = self.cfg, self.state
        reason = ""
        if self.stop_reason:
            reason = self.stop_reason
        elif cfg.patience and st.stale >= cfg.patience:  # asked after each evaluation, never inside one
            reason = patience_reason(cfg.patience)
        elif cfg.max_steps and st.step >= cfg.max_steps:
            reason = f"reached train.max_steps={cfg.max_steps}"
        elif self.clock and (left := self.clock.for_training()) is not None and left <= 0:
            reason = (f"time limit: after {st.elapsed:.0f} s of training and validation, the rest of the time "
                      f"kept for the last validation, the final evaluation and the report (about {self.clock.reserve():.0f} s)")
        elif st.decay and self.share <= 0:
            fell = st.step - int(st.decay[0]) + 1
            reason = (f"the cool-down brought the learning rate to zero ({fell} update{'s' * (fell != 1)} from "
                      f"step {int(st.decay[0])})")
        if self.world > 1:
            flag = torch.tensor(float(bool(reason)), device=self.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            if flag.item() and not reason:
                reason = "another rank stopped"
        return reason

    def _budget(self) -> float | None:
        """Seconds of training and validation the time limit allows in all: those used and those left."""
        left = self.clock.for_training() if self.clock else None
        return None if left is None else self.state.elapsed + left

    def epoch_updates(self, lengths: Indices) -> list[list[Batch]]:
        """This rank's updates for the current epoch (see :func:`epoch_updates`)."""
        return epoch_updates(self.cfg, lengths, self.state.epoch, self.rank, self.world)

    def planned_updates(self) -> int:
        """The updates this run plans (every epoch has as many); 0: unknown, the clock is the budget."""
        return planned_updates(self.cfg, len(self.epoch_updates(self.train_data.lengths())))

    def fit(self, limit: clock.Clock | None = None) -> dict:
        """Train until the epochs, step limit or time limit run out; returns the final state.

        ``limit`` is the time limit's clock: training stops when it has no seconds left for training
        (what it keeps back for the final evaluation is asked at every check, so a better estimate
        counts at once), and its time source is the trainer's. A resumed run's clock counts the
        training of earlier attempts, and keeps back what it kept when the checkpoint was saved.
        """
        cfg, st = self.cfg, self.state
        st.stopped = ""  # why an earlier attempt stopped (a signal, saved with its checkpoint) is not why this one does
        now = limit.now if limit else time.monotonic
        started = now() - st.elapsed
        self.clock = limit
        if limit:
            limit.spent = st.elapsed
            limit.restore(st.clock)
        self.net.train()
        lengths = self.train_data.lengths()
        if not self.epoch_updates(lengths):  # every epoch has as many: none would count epochs forever
            raise TaskformerError(f"the train split gives this process no update in an epoch ({len(lengths):,} "
                                  f"examples, {self.world} processes, train.accumulate={cfg.accumulate}); give more "
                                  "data or fewer processes")
        self.total_steps = self.planned_updates()
        last_log, tokens_since = now(), 0
        try:
            while not cfg.epochs or st.epoch < cfg.epochs:
                updates = self.epoch_updates(lengths)
                data = self.train_data.for_epoch(st.epoch, cfg.seed)  # a language model's text cut anew
                while st.batch < len(updates):
                    begun = now()
                    micro = [(src.to(self.device), tgt.to(self.device))
                             for src, tgt in (collate(data, b) for b in updates[st.batch])]
                    loss, count = self._step(micro)
                    st.step += 1
                    st.batch += 1
                    st.tokens += count
                    tokens_since += count
                    st.elapsed = now() - started
                    if limit:
                        limit.observe(now() - begun)
                    if self.threads and (change := self.threads.follow(st.elapsed, st.step)):
                        st.threads.append(change)
                        self.on_event({"event": "threads", **change})  # said, and kept in the state, not logged
                    self._schedule_next()
                    self.on_event({"event": "update", "step": st.step, "epoch": st.epoch, "epochs": cfg.epochs,
                                   "elapsed": st.elapsed, "tokens": st.tokens, "planned": self.total_steps,
                                   "budget": self._budget()})
                    if st.step % cfg.log_every == 0:
                        logged = now()
                        self.log(event="train", epoch=st.epoch, epochs=cfg.epochs, loss=round(loss, 4),
                                 lr=self.scheduler.get_last_lr()[0],
                                 tokens_per_s=tokens_since / max(logged - last_log, 1e-9),
                                 progress=st.batch / len(updates), elapsed=round(st.elapsed, 2))
                        last_log, tokens_since = logged, 0
                    if cfg.eval_every and st.step % cfg.eval_every == 0:
                        self._evaluate()
                        self.save()
                    elif cfg.save_every and st.step % cfg.save_every == 0:
                        self.save()
                    reason = self._stop_requested()
                    if reason:
                        raise Stop(reason)
                st.epoch += 1
                st.batch = 0
                if not cfg.eval_every:
                    self._evaluate()
                self.save()
                st.elapsed = now() - started  # the limit counts validation too
                reason = self._stop_requested()
                if reason and (not cfg.epochs or st.epoch < cfg.epochs):
                    raise Stop(reason)
            if st.evaluated_at != st.step:  # eval_every did not land on the last step
                self._evaluate()
                self.save()
        except Stop as why:
            st.stopped = str(why)
            if st.evaluated_at != st.step and not self.stop_reason:
                self._evaluate()  # a partial epoch still gets its chance to be the best
            self.save()
        finally:
            if self.threads:  # what follows training has the threads it started with
                self.threads.restore()
        st.elapsed = now() - started
        return asdict(st)
