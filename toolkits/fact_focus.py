"""A kind of fact the warm start's skill stage cannot start copying, trained alone for a while.

The skill stage learns its four kinds of fact one after another, each in a sudden jump. The draw by kind
(``toolkits.sft_training.fact_weights``) gives an uncopied kind most of the batches, and that is usually enough. On
toolcall seed 1 under AVX2 kernels it was not: born_in, country and profession were copied at 0.93-1.00 from step
1150 on, and employer stayed at 0.00-0.11 until the 1600-step cap, with about three batches in four its own. Each
company name is one token, and the model answered every employer question with one or two fixed companies, the
suffix right (docs/history/results.md).

Trained on employer questions alone from its step-1000 model, it copied employer at 0.98 within 250-300 steps (three
runs of three, one with the queries masked), while the other kinds fell to near zero (it answered every question
with what follows "for"); 50 steps of the usual draw then brought every kind back (answer copy 0.94, employer 0.82).
From its step-1400 model the same round did not move employer in 400 steps: a stall hardens, so the round must come
early. So a kind that stays uncopied while the others are mostly copied gets a focus round after a few readings:
batches of that kind only, from a new optimizer state, until it is copied or the round's steps run out, then the
usual draw again.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkits.warmstart_probes import ProbeReading


@dataclass(frozen=True)
class FocusRule:
    """When a kind of fact counts as stalled, and how long it is then trained alone."""

    patience: int = 5
    """Probe readings in a row the kind must be stalled before its focus round starts. A stalled model becomes harder
    to move: on toolcall seed 1 under AVX2 kernels a round from its step-1000 model copied employer within 250 steps
    (three runs of three), one from its step-1400 model not in 400. With 5 readings and ``others_at_least`` 0.5 the
    rule starts a round on two of the six toolcall runs measured (seeds 0, 1 and 2, native and AVX2 kernels): AVX2
    seed 1 at step 1000 and AVX2 seed 0 at step 400 (which learned employer by itself at 550)."""
    stalled_below: float = 0.2
    """A kind copied below this share of its validation answers is not copied yet."""
    others_at_least: float = 0.5
    """Stalled only while every other kind is copied at least this well: before that, kinds still start on their
    own, and a focus round would unlearn what the others are picking up."""
    done_at: float = 0.9
    """The round ends at the first reading where its kind is copied this well."""
    max_steps: int = 400
    """Or at the first reading this many steps into the round, copied or not."""
    fresh_optimizer: bool = True
    """Start and end the round with a new AdamW state and the lr warm-up again, as the rounds that worked did (each
    ran from a saved model, so with a new state). Whether the old state would do as well was not measured from step
    1000; from step 1400 neither did (old state: employer 0.02-0.09 after 300 steps; new: 0.07 after 400)."""

    def __post_init__(self) -> None:
        if self.patience < 1 or self.max_steps < 1:
            raise ValueError(f"focus rule: patience and max_steps must be >= 1, got {self.patience} and "
                             f"{self.max_steps}")
        for name in ("stalled_below", "others_at_least", "done_at"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"focus rule: {name} is a share of answers, in [0, 1]; got {getattr(self, name)}")


class FactFocus:
    """Follows the probe readings of one stage and says which kind of fact to train alone, if any."""

    def __init__(self, rule: FocusRule):
        self.rule = rule
        self.focus: str | None = None
        """The kind in its focus round now (None: every kind, drawn by ``fact_weights``)."""
        self._stalled: str | None = None
        self._streak = 0
        self._started_at = 0

    def stalled_kind(self, reading: ProbeReading) -> str | None:
        """The one kind copied below ``stalled_below`` while every other is at ``others_at_least``, if there is one."""
        copied = reading.answer_copy_by_fact
        behind = [fact for fact, share in copied.items() if share < self.rule.stalled_below]
        if len(behind) != 1 or len(copied) < 2:
            return None
        if all(share >= self.rule.others_at_least for fact, share in copied.items() if fact != behind[0]):
            return behind[0]
        return None

    def update(self, step: int, reading: ProbeReading) -> str | None:
        """Read at ``step`` steps into the stage; a line saying what changed (a round starts or ends), or None."""
        rule = self.rule
        if self.focus is not None:
            copied = reading.answer_copy_by_fact.get(self.focus, 0.0)
            if copied < rule.done_at and step - self._started_at < rule.max_steps:
                return None
            ended, self.focus, self._stalled, self._streak = self.focus, None, None, 0
            why = "copied" if copied >= rule.done_at else f"its {rule.max_steps} steps are up"
            return f"focus on {ended} ends ({why}: {copied:.2f}); every kind drawn again"
        stalled = self.stalled_kind(reading)
        same = stalled is not None and stalled == self._stalled
        self._streak = self._streak + 1 if same else int(stalled is not None)
        self._stalled = stalled
        if self._streak < rule.patience:
            return None
        self.focus, self._started_at, self._streak = stalled, step, 0
        return (f"{stalled} copied under {rule.stalled_below:g} for {rule.patience} readings while every other kind is "
                f"at {rule.others_at_least:g} or more: training on {stalled} questions alone until copied at "
                f"{rule.done_at:g} (at most {rule.max_steps} steps)")

    def weights(self, facts: tuple[str, ...]) -> list[float]:
        """Draw weights during a focus round: the focused kind's trajectories only."""
        return [1.0 if fact == self.focus else 0.0 for fact in facts]
