"""Auto mode's side of the Batch Manager: what it has measured and the plan it follows.

Every call's busy time feeds the cost model (gateway/cost_model.py) and every verified step
the acceptance estimate (gateway/acceptance_estimate.py), in every mode, so the numbers are
there to read in GetServerInfo and the step records. In auto mode the Batch Manager also
asks for a new plan (gateway/planner.py) every `replan_interval_s`, and each request's draft
length follows the plan's rule and its own acceptance at every step in between.

How a layout really runs is measured too, on what it delivered: while a plan is in force
(a "spell"), the tokens its requests received and the prompt tokens prefilled, and what
the model says those should have taken in that layout (tokens over the plan's decode rate,
plus each prompt token at the layout's own prefill price). The measured seconds over the
predicted ones, over the layout's recent spells, is its "slowdown": it takes in everything
the step arithmetic leaves out (contention, imperfect overlap, stalls, the gateway's own
work, acceptance misjudged), and the planner divides the layout's predicted rate by it, so a
layout that delivers less than its arithmetic says stops being chosen. Prompts are priced
per layout so that a wave of prefills weighs on each layout at its own cost, whichever was
in force when it came. A layout not measured lately that would come within EXPLORE_WITHIN
of the best if it ran no slower against the model than the best does is tried for a while,
so the choice rests on measurements of every contender rather than on the model alone.
"""

from __future__ import annotations

import logging
import math
import time
import zlib
from collections import deque
from dataclasses import dataclass, replace
from typing import NamedTuple

from gateway.acceptance_estimate import AcceptanceEstimate
from gateway.cost_model import CostModel, StepCosts
from gateway.planner import Plan, PlanRequest, choose_plan, layout_step_s
from gateway.request import ActiveRequest
from minedraft.constants import LAYOUTS
from minedraft.v1 import generation_pb2

logger = logging.getLogger("minedraft.gateway")
SPELLS_KEPT = 64          # measured spells per layout the slowdown is read from
SLOWDOWN_SPAN_S = 30.0      # a layout's slowdown: its spells within this long (of serving) of its latest
MEASURED_ENOUGH_S = 0.3     # a layout's slowdown is read once this long of its running is measured
MEASURED_ENOUGH_DRAWS = 32  # ... and, for a drafting layout, this many request-steps (a step of a
                            # request gives 1 to k + 1 tokens by chance: at k = 2 and acceptance
                            # 0.7, 2.2 on average with a spread of 0.9. Where a step takes 140 ms,
                            # one request's 0.3 s holds two of them, whose tokens alone could read
                            # anywhere from half to 1.4 times its rate)
LUCK_PULL_DRAWS = 128      # request-steps: see AutoPlanner._slowdowns (at k = 4 and acceptance 0.7
                            # a step gives 2.8 tokens with a spread of 1.5: over 128 of them the
                            # share strays 5% by chance, over 32 10%)
SLOWDOWN_PULL = (0.005, 0.05)  # s: the decoding and prefill slowdowns are pulled towards 1 as if
                            # by this much on time (a single prompt's prefill in a spell must not
                            # read as prefill's price)
SETTLE_STEPS = {"ar": 5, "sd": 1, "psd": 2}   # a switch has settled once this many steps of the
                            # new layout came back (one per batch in psd; in plain decoding the
                            # two in flight and three more: the first three steps on the lent
                            # cores after drafting took twice their prediction at C = 64, and a
                            # trial of plain decoding that counted them read it 1.3x slow) ...
SETTLE_S = {"ar": 0.3, "sd": 0.0, "psd": 0.0}   # ... and this long has passed since it: plain steps
                            # on the lent cores run slow for a while after drafting, whatever
                            # their length (layouts rotated every 40 steps, medians over the
                            # switches: 15-30% slow until 60-70 ms after the switch at C = 2 and
                            # 15-40% until 190 ms at C = 32; 10% until about 280 ms in an earlier
                            # run at C = 32), and a trial of plain decoding was read 5-12% slow
AFTER_IDLE_STEPS = {"ar": 1, "sd": 1, "psd": 2}   # after idling, a spell is counted from the return
                            # of this many steps of its layout (each batch's first: its prompts'
                            # prefill, the pipeline refilling), not from the next plan: at C = 1
                            # in a closed loop every request follows an idle moment, and a third
                            # of each was counted (a 1.5 s trial of sd measured 0.21 s of it)
MATURE_CALLS = 8            # calls of a kind the cost model needs before its predictions are judged
SWITCH_MARGIN = 1.10        # a new layout must be predicted this much faster than the current (a
                            # switch drains the pipeline and drafting catches up: not free) ...
MEASURED_MARGIN = 1.03      # ... or only this much where both were measured for CONFIRM_S lately:
                            # their rates are then what they delivered, not the model's word, and
                            # a layout 3-9% ahead is worth having (psd k=4 at C = 2 on the unix
                            # plane: 5% ahead of plain decoding, which auto kept on the 10% margin)
CONFIRM_S = 2.0             # A trial that reads its layout within CONFIRM_WITHIN of the settled one
CONFIRM_WITHIN = 0.97       # goes on until this long of it is measured (CONFIRM_MAX_S at most), so
CONFIRM_MAX_S = 4.0         # that MEASURED_MARGIN can judge it; that time is not charged to the
                            # trial budget (the layout runs about as fast as the settled one). A
                            # trial's 0.3-1.5 s reads a layout's rate a tenth or more either way
                            # here (psd at C = 2 after its first trial: 0.77-0.95 of plain
                            # decoding in four servers, where fixed psd k=4 ran 0.98-1.05 of `ar`)
TO_PLAIN_MARGIN = 1.02      # ... but plain decoding only this much: leaving a drafting layout
                            # costs one step's drain and no catch-up, and plain decoding is what
                            # auto must never lose to (kept on the 10% margin, psd ran at 0.89
                            # of plain decoding for the rest of a run at C = 8)
TRIAL_MARGIN = 1.25         # drafting for requests not yet measured must be predicted this much
                            # faster than plain decoding at their hopeful price (see _hopeful_plan)
TRIAL_BACKOFF_S = (0.5, 30.0)   # after such a trial that left the plan in plain decoding, the next
                            # waits this long, twice as long after each one more in a row, up to
                            # the second figure; one after which drafting was chosen ends the wait
                            # (at C = 1 on the bundled pair, whose requests draft alike, one began
                            # for every request, 34 in 33 s, each two switches, none chosen on)
EXPLORE_WITHIN = 0.9        # try a layout not measured lately if predicted this close to the best
                            # (its measured slowdown, where worse than the best's, set aside)
FIRST_EXPLORE_WITHIN = 0.6      # ... from this close while it was never measured (early in a run)
EXPLORE_MAX_S = 1.5         # ... until enough of it is measured (see _enough), or for this long at
                            # most, or where its steps are long, for the time of twice
                            # MEASURED_ENOUGH_DRAWS request-steps at its predicted pace
LEAD_PLANS = 2              # a settled layout, running, is left for another only once that one has led
                            # it past the margin in this many plans in a row at its load: at C = 2
                            # one plan's price of psd fell 10-15% (a request's first drafts, say)
                            # and rose back at the next, and psd, settled on 3% (MEASURED_MARGIN),
                            # was left and taken again 20 times in 45 s
LOAD_DROP_S = 0.25          # fewer requests than the settled layout was chosen for: kept this long
                            # before the choice follows (a closed loop's wave ends, the next begins)
SWITCH_HORIZON_S = 5.0      # a one-off cost of switching layout is spread over this long
RECHECK_AFTER_S = 15.0      # a contender (see _layout_to_try) not measured for this long is tried
                            # again: its old measurement may no longer hold;
RECHECK_MAX_S = 240.0       # each re-check that leaves it unchosen doubles its wait, up to this,
LOAD_MOVED_S = 2.0          # until the load has been another (beyond a factor of two) for this long
                            # of serving (see _follow_load).
FLOOR_STALE_S = 30.0        # plain decoding, the floor, not measured for this long (or its doubled
                            # wait) while a drafting layout is settled is re-checked whatever its
                            # prediction: its lent-core costs are fitted only while it runs, and
                            # fitted while another process held the cores they priced it at half
                            # its speed for good (C = 8: psd at 0.86 of it, never re-checked)
FLOOR_FIRST_RECHECK_S = 2.0 # plain decoding left for a drafting layout while only its own measured
                            # slowdown keeps it behind is re-checked this soon, then four times as
                            # long after each re-check that keeps it out, while under FLOOR_STALE_S
                            # (2 s, 8 s, then as overdue), free of the trial budget: the reading may
                            # be a moment's (at C = 64 one cluster's lent steps ran a quarter slow
                            # for seconds, psd was chosen on it, and ran at 0.84-0.91 of plain
                            # decoding for two minutes)
FLOOR_MEASURED_S = 2.0      # plain decoding, settled, is left for a drafting layout on the model's
                            # word only once this long of it is measured within SLOWDOWN_SPAN_S:
                            # read from its first spells after the start's trials its slowdown
                            # came out at 1.2-1.37, and its price moved by a quarter between plans
                            # a second apart; psd, chosen on such readings, ran for seconds at
                            # 0.81-0.94 of plain decoding (C = 4, fresh servers)
FLOOR_HOLD_MAX_S = 6.0      # ... or once it has been settled this long all the same (its spells may
                            # not count: a load that never settles into its plan's batch)
RECHECK_PER_MEASURED = 5.0  # A layout measured for only a moment is re-checked sooner: after this
RECHECK_MIN_S = 1.0         # many times as long as it was measured, and never sooner than this
EXPLORE_SHARE = 0.02        # trials of layouts measured before take at most this share of the time
                            # requests ran (each costs two switches and runs a layout likely worse:
                            # what trials cost must stay well inside the 3% auto may lose to the
                            # best fixed setting; at 5%, re-checks took 5-10% of short bench runs),
EXPLORE_WINDOW_S = 120.0    # of about the last this long (an hour without trials earns no burst;
                            # long enough that a trial of EXPLORE_MAX_S fits in the share)
HELD_BACK_S = 15.0          # a drafting layout left for another is not chosen again on the model's
                            # word at about the load it was left at, while requests it was left for
                            # run, for this long, unless measured since (a re-check): at C = 2 the
                            # three layouts' rates, read from spells of 0.2-0.6 s, swung 10-20%
                            # between plans a fifth of a second apart, and auto went from plain
                            # decoding to sd or psd predicted 11% ahead, measured them slower,
                            # went back, and chose them again half a second later
                            # (3 of 5 runs drafted so for a fifth to half of their steps: 0.86,
                            # 0.92 and 1.04 of fixed `ar`)
SPELL_BATCH = 1.25          # a spell is measured only if its steps' mean batch is within this factor
                            # of its plan's (see _as_planned)
NEAR_LOAD = 1.25            # a layout's slowdown at a load is read from its spells planned for requests
                            # within this factor of it, where those are enough (see _slowdowns):
                            # psd at C = 4 read 1.6 over its spells for 2 requests (a wave's tail),
                            # 0.96 for 3 and 1.08 for 4; priced at 4 from a trial at 3 and 4 that
                            # read 0.86, it stood a third above plain decoding and was chosen
DELIVERED_ENOUGH_S = 1.0    # Plain decoding, the floor, is chosen over a drafting layout whatever the
                            # model says where, at about the load, it delivered at least as many tokens
                            # a second as that layout, each measured this long within SLOWDOWN_SPAN_S
                            # of its latest (see _plain_delivers_more): at C = 16 auto ran psd, priced
                            # 3-18% ahead, for 26% and 10% of its steps in two runs of twelve paired
                            # passes and read 0.84 and 0.92 of fixed `ar`; in one server psd's runs
                            # delivered 557-652 tok/s and plain decoding's 699-710, the two read
                            # alike against the model (plain decoding's spells held none of its
                            # waves' prefill: they were not the batch planned)
FLOOR_DELIVERY_MAX_S = 3.0  # Plain decoding not measured end to end at a load where a drafting layout
                            # is settled and was (DELIVERED_ENOUGH_S there; or measured there only
                            # briefly, before that layout settled: see _floor_unproven) is tried until it is,
                            # for this long at most (its switch settles first, SETTLE_S), whatever
                            # the model says: at C = 16 psd, priced 5-8% ahead, was settled while plain
                            # decoding's one trial at that load was cut short by a wave's end, and
                            # ran 76% of the steps of a paired run at 0.85 of fixed `ar` (its 64
                            # requests' waves prefill whole in plain decoding, spread out in psd:
                            # the spells the model is read against hold neither). Once per load and
                            # FLOOR_STALE_S of serving: a measurement stands (see _delivered_rate).
HISTORY_KEPT = 512          # decisions GetServerInfo shows (a couple of minutes at the usual pace)
IDLE_SPANS_KEPT = 256       # idle spells remembered to age measurements by serving time (_serving_age)


@dataclass
class _Spell:
    """A plan in force from `since` until the next plan: what it delivered against its promise."""
    layout: str
    since: float
    draft_lengths: tuple[int, ...]  # the plan's, one per request (all 0 in plain decoding) ...
    emitted: float                  # ... and the tokens a step of them was expected to give
    counted: bool                   # not while a switch settles (the pipeline refills and drafting
                                    # catches up: the switch's cost) ...
    after_idle: bool = False        # ... and the first after idling only from the return of its
                                    # AFTER_IDLE_STEPS (counted turns True then)
    tokens: int = 0                 # delivered to requests by the steps that came back meanwhile
    expected: float = 0.0           # ... and what they were expected to deliver at the k they ran
    prompt_tokens: int = 0          # ... and prefilled by them
    batch_sum: int = 0              # ... and the requests they verified (steps with any), for the
    batch_steps: int = 0            # mean batch: a spell is measured against its plan's steps


class _Trial(NamedTuple):
    """A layout being tried (see AutoPlanner._layout_to_try)."""
    layout: str
    since: float
    free: bool                      # free of the trial budget: the layout's first measurement, or a
                                    # close contender's (AutoPlanner._close), not another re-check
    confirming: float | None = None     # since when it runs on to be measured for CONFIRM_S
    delivering: bool = False        # plain decoding run until it has delivered enough to be
                                    # judged end to end (FLOOR_DELIVERY_MAX_S)
    why: str = ""                   # what started it, for the log


class _Measured(NamedTuple):
    """A spell measured: what it delivered and how long it took. What the model says it
    should have taken is asked again whenever it is read (`AutoPlanner._predicted_s`)."""
    ended: float
    draft_lengths: tuple[int, ...]
    emitted: float
    tokens: int
    prompt_tokens: int
    seconds: float
    draws: int                      # request-steps: the requests its steps verified, summed
    expected: float                 # the tokens expected at the draft lengths its steps ran


def _as_planned(spell: _Spell) -> bool:
    """Whether the spell's steps verified about the batch its plan was made for (within
    SPELL_BATCH; psd's steps are half batches). Its prediction is its plan's step: a spell
    planned for 2 requests at a wave's tail in which one ran read 1.9x slow, one planned for 3
    in which 4 ran 0.8x, and such readings moved the slowdowns that decide (plain decoding's
    read 1.5 in one C = 4 run, and psd, predicted ahead, was chosen and ran at 0.8 of it)."""
    if not spell.batch_steps:
        return True
    planned = len(spell.draft_lengths) / (2 if spell.layout == "psd" else 1)
    mean = spell.batch_sum / spell.batch_steps
    return planned / SPELL_BATCH <= mean <= planned * SPELL_BATCH


def _near_load(spell: "_Measured", running: int) -> bool:
    """Whether the spell was planned for about `running` requests (within NEAR_LOAD)."""
    return 1 / NEAR_LOAD <= len(spell.draft_lengths) / max(1, running) <= NEAR_LOAD


def _latest(spells: deque["_Measured"], since: float, running: int | None = None) -> list["_Measured"]:
    """The spells that ended since `since`, and of those only the ones planned for about
    `running` requests if given (NEAR_LOAD)."""
    return [spell for spell in spells if spell.ended >= since and (running is None or _near_load(spell, running))]


def _same_load(running: int, then: int) -> bool:
    """Whether `running` requests are about the load of `then` (within a factor of two)."""
    return 0.5 <= running / max(1, then) <= 2.0


class AutoPlanner:
    def __init__(self, k_max: int, replan_interval_s: float = 0.2, cycle_steps: int = 0) -> None:
        """cycle_steps > 0 is for tests: ignore the costs, rotate the layouts every that many
        steps and give requests varied draft lengths, so switches certainly happen."""
        self.k_max = k_max
        self.model = CostModel()
        self.acceptance = AcceptanceEstimate(k_max)
        self.replan_interval_s = replan_interval_s
        self.cycle_steps = cycle_steps
        self.plan = Plan("ar", {}, ((),), 0.0, 0.0)
        self.replans = 0
        self.layout_switches = 0
        self._measured: dict[str, deque[_Measured]] = {layout: deque(maxlen=SPELLS_KEPT) for layout in LAYOUTS}
        # Every counted spell, as planned or not (a wave's prefill, a tail): what each layout
        # delivered, end to end (see _plain_delivers_more).
        self._delivered: dict[str, deque[_Measured]] = {layout: deque(maxlen=SPELLS_KEPT) for layout in LAYOUTS}
        # Per layout, its slowdowns as last read, and what they were read from (the costs,
        # the spells).
        self._slowdowns_read: dict[tuple[str, int | None], tuple[tuple, tuple[float, float]]] = {}
        self._spell: _Spell | None = None
        self._planned_at = float("-inf")
        self._planned_for = 0
        self._steps = 0                 # verify steps come back (plain ones on the way to drafting not counted)
        self._exploring: _Trial | None = None      # the layout being tried
        self._steady = False            # the last plan ran requests (not the first after idling)
        self._settling = 0              # steps of the new layout still to come back after a switch ...
        self._settle_until = float("-inf")      # ... and when it has settled at the earliest
        self._settled = "ar"            # the layout chosen on the numbers (not one being tried) ...
        self._settled_for = 0           # ... for this many requests
        self._settled_at = time.monotonic()     # ... since then
        self._fewer_since: float | None = None      # when fewer than that began running
        # The layout leading the settled one past the margin, in how many plans in a row, the
        # latest of them (its number in self.replans): see LEAD_PLANS.
        self._leading = ("", 0, 0)
        # The layout settled for the most requests since the last idle spell (the body of a
        # wave, not its tail), and for how many: what the next wave starts from.
        self._wave_settled: tuple[str, int] | None = None
        # Per drafting layout, when the plan last moved off it for another settled layout, and
        # the requests running then (see HELD_BACK_S).
        self._left: dict[str, tuple[float, frozenset[str]]] = {}
        self._recheck_after: dict[str, float] = {}     # per layout, how long until it is re-checked
        self._floor_wait: float | None = None           # plain decoding's next early re-check (see
                                                        # FLOOR_FIRST_RECHECK_S; None: none owed)
        self._recheck_load = 0                          # requests running when those were reset ...
        self._load_moved_since: float | None = None     # ... and since when the load is another
        self._floor_delivery_tried: dict[int, float] = {}  # per load, when plain decoding was last
                                                        # tried to measure what it delivers there
        self.explorations = 0
        self.request_trials = 0         # trials of drafting for fresh requests on a hopeful price ...
        # ... and the one in force: (until when at most, the requests it was begun for).
        self._request_trial: tuple[float, frozenset[str]] | None = None
        self._trial_wait_s = 0.0        # how long after the latest that left plain decoding the next waits ...
        self._trial_ended = float("-inf")   # ... and when that one ended
        self._started = time.monotonic()
        self._idle_since: float | None = None       # since when nothing has run (None: requests run) ...
        self._idle_spans: deque[tuple[float, float]] = deque(maxlen=IDLE_SPANS_KEPT)    # ... and before
        self._running_s = 0.0           # time with requests running, from plan to plan, lately ...
        self._trial_s = 0.0             # ... and the part of it spent on trials (both decaying)
        self._trial_length_s = MEASURED_ENOUGH_S    # how long the latest trial lasted, settling included
        # What was decided when, and what each layout was predicted to give then; the times on
        # the step records' clock (the Batch Manager sets the origin to theirs).
        self.history: deque[generation_pb2.PlanDecision] = deque(maxlen=HISTORY_KEPT)
        self.clock_origin = time.perf_counter()

    # ---- measuring -------------------------------------------------------------------------
    def observe_step(self, layout: str, tokens: int, prompt_tokens: int, batch: int,
                     expected: float | None = None) -> None:
        """A verify step in `layout` came back ("" while the batches are still moving to the
        plan's layout): the tokens it gave its requests (accepted drafts and the target's
        own), the prompt tokens it prefilled and the requests it verified. expected: the
        tokens its requests were expected to receive at the draft lengths they ran (default:
        those received), which keeps acceptance's luck apart from the layout's pace (see
        _slowdowns)."""
        if layout != "ar" or self.plan.layout == "ar":     # (not plain steps on the way to drafting)
            self._steps += 1
        if layout == self.plan.layout and self._settling:
            self._settling -= 1
            spell = self._spell
            if not self._settling and spell is not None and spell.after_idle:   # counted from now on
                self._spell = _Spell(spell.layout, time.monotonic(), spell.draft_lengths, spell.emitted, counted=True)
                return
        if self._spell is not None:
            self._spell.tokens += tokens
            self._spell.expected += tokens if expected is None else expected
            self._spell.prompt_tokens += prompt_tokens
            if batch:
                self._spell.batch_sum += batch
                self._spell.batch_steps += 1

    def idle(self) -> None:
        """Nothing is running: the spell in force ends now, measured up to its last step
        (the idle time that follows is no layout's). The next begins with the first request
        after it and is counted from the return of its layout's AFTER_IDLE_STEPS (the
        prompts' prefill and the pipeline's refill are not its pace). Ended unmeasured, a
        layout serving one request after another was never measured: each spell it was
        counted in ended idle; and counted only from the next plan on, a fifth of a second
        later, a third of each request at C = 1 was.
        The first request after idling keeps the settled layout for LOAD_DROP_S, as any drop
        in load does (_layout_to_keep): with the clock of a drop in the last wave's tail still
        running, the first of the next wave was planned alone (sd, at C = 64), drafted, and
        taught the acceptance estimate what started trials of psd and sd in the wave after.
        What it keeps is the layout settled for the wave's body, not its tail: after the tail
        had settled on sd for its last two requests, the next wave of eight, another load,
        was planned afresh and ran psd, predicted 3% above plain decoding, for 0.4-1.2 s of
        the bench's 2 s run at C = 8 (0.90-0.93 of the rounds that kept plain decoding)
        before psd's measurement put it back below. Kept, plain decoding stays unless psd is
        predicted SWITCH_MARGIN faster."""
        now = time.monotonic()
        self._end_spell(now)
        if self._idle_since is None:
            self._idle_since = now
        self._steady = False
        self._fewer_since = None
        if self._wave_settled is not None:
            self._settle(*self._wave_settled)
            self._wave_settled = None

    def _end_spell(self, now: float) -> None:
        spell, self._spell = self._spell, None
        mature = self.model.verify_calls >= MATURE_CALLS and (spell is None or spell.layout == "ar"
                                                              or self.model.draft_calls >= MATURE_CALLS)
        if spell is None or not spell.counted or not mature or now <= spell.since:
            return
        measured = _Measured(now, spell.draft_lengths, spell.emitted, spell.tokens, spell.prompt_tokens,
                             now - spell.since, spell.batch_sum, spell.expected)
        self._delivered[spell.layout].append(measured)
        if spell.emitted > 0 and _as_planned(spell):
            self._measured[spell.layout].append(measured)
            if logger.isEnabledFor(logging.DEBUG):
                decoding, prefill = self._predicted_s(spell.layout, measured, self.costs(), {})
                logger.debug("auto: %s for %d requests measured %.1f ms for %d tokens (%.1f expected) and %d prompt "
                             "tokens; predicted %.1f + %.1f ms", spell.layout, len(spell.draft_lengths),
                             1e3 * measured.seconds, spell.tokens, spell.expected, spell.prompt_tokens, 1e3 * decoding,
                             1e3 * prefill)

    def _recent(self, layout: str, since: float | None = None, running: int | None = None) -> list[_Measured]:
        """The layout's spells since `since`, by default its latest SLOWDOWN_SPAN_S of serving
        (an old measurement stands until the layout is measured again, see _layout_to_try),
        and of those only the ones planned for about `running` requests if given (NEAR_LOAD)."""
        spells = self._measured[layout]
        if since is None:
            since = self._span_start(spells[-1].ended) if spells else 0.0
        return _latest(spells, since, running)

    def _delivered_rate(self, layout: str, running: int) -> float | None:
        """Output tokens a second the layout delivered over its counted spells planned for
        about `running` requests (NEAR_LOAD) within SLOWDOWN_SPAN_S of its latest, as planned
        or not: end to end, a wave's prefill and its stalls included. None where those spells
        last under DELIVERED_ENOUGH_S."""
        return self._delivered_since(layout, running, float("-inf"))

    def _delivered_since(self, layout: str, running: int, since: float) -> float | None:
        """_delivered_rate from the spells of it that ended after `since` only."""
        tokens, seconds = self._delivered_over(layout, running, since)
        return tokens / seconds if seconds >= DELIVERED_ENOUGH_S else None

    def _delivered_over(self, layout: str, running: int, since: float = float("-inf")) -> tuple[int, float]:
        """(tokens, seconds) of the spells _delivered_rate reads at about `running` requests,
        those that ended after `since` only."""
        spells = self._delivered[layout]
        if spells:
            since = max(since, self._span_start(spells[-1].ended))
        near = _latest(spells, since=since, running=running)
        return sum(spell.tokens for spell in near), sum(spell.seconds for spell in near)

    def _delivered_rates(self, running: int) -> dict[str, float]:
        """Each layout's _delivered_rate at about `running` requests, where it has one."""
        rates = {layout: self._delivered_rate(layout, running) for layout in LAYOUTS}
        return {layout: rate for layout, rate in rates.items() if rate is not None}

    def _plain_delivers_more(self, layout: str, running: int) -> bool:
        """Whether plain decoding delivered at least what the drafting `layout` did at about
        `running` requests, both measured DELIVERED_ENOUGH_S there (_delivered_rate): the
        floor auto must not lose to, judged on what each delivered rather than on the model
        the slowdowns are read against. A layout's spells leave out what the plan does not
        price in its step (a closed loop's waves of prompts come to plain decoding whole
        and to psd spread out; psd's pipeline stalls at a wave), and a drafting layout
        priced ahead on them may deliver less than plain decoding did."""
        if layout == "ar":
            return False
        drafting, plain = self._delivered_rate(layout, running), self._delivered_rate("ar", running)
        return drafting is not None and plain is not None and plain >= drafting

    def _measured_s(self, layout: str, since: float | None = None, running: int | None = None) -> float:
        return sum(spell.seconds for spell in self._recent(layout, since, running))

    @staticmethod
    def _enough(layout: str, spells: list[_Measured]) -> bool:
        """Whether these spells are enough to read the layout's slowdown from: MEASURED_ENOUGH_S
        of its running and, if it drafts, MEASURED_ENOUGH_DRAWS request-steps (its tokens are
        partly chance, and where steps are long a fraction of a second holds one or two)."""
        return (sum(spell.seconds for spell in spells) >= MEASURED_ENOUGH_S
                and (layout == "ar" or sum(spell.draws for spell in spells) >= MEASURED_ENOUGH_DRAWS))

    @staticmethod
    def _predicted_s(layout: str, spell: _Measured, costs: StepCosts,
                     step_times: dict[tuple[int, ...], float | None]) -> tuple[float, float]:
        """(decoding, prefill): what the model says now that the spell's work should have
        taken: the tokens it was expected to give at the rate of its plan's steps (the time
        its steps should have taken, whatever acceptance's luck), its prompts at the layout's
        prefill price. Asked of today's model, not the one of the spell's time, so that a layout's
        measured rate stands while the model moves (the lent-core ratio and the fits move
        with every call: plain decoding's prediction swung 235-314 tok/s between plans at
        C = 2 with nothing else changed, and a slowdown read against each spell's own
        prediction carried the swing into the choice). step_times: the layout's step time by
        draft lengths, filled as they are asked (a layout's spells mostly share a few)."""
        if spell.draft_lengths not in step_times:
            step_times[spell.draft_lengths] = layout_step_s(layout, costs, spell.draft_lengths)
        step = step_times[spell.draft_lengths]
        decoding = spell.expected * step / spell.emitted if step else 0.0
        return decoding, spell.prompt_tokens * costs.prefill_per_token(layout)

    def slowdown(self, layout: str, running: int | None = None) -> float:
        """Measured over predicted time of the layout's decoding lately (1 until enough of
        it is measured, see _enough), at about `running` requests where enough was measured
        there (None: at every load)."""
        return self._slowdowns(layout, running)[0]

    def priced_slowdown(self, layout: str, running: int | None = None) -> float:
        """The decoding slowdown the plan prices the layout at (see _planning_slowdowns)."""
        return self._planning_slowdowns(running)[layout][0]

    def prefill_slowdown(self, layout: str, running: int | None = None) -> float:
        """... and of its prefill."""
        return self._slowdowns(layout, running)[1]

    def _slowdowns(self, layout: str, running: int | None = None) -> tuple[float, float]:
        """(decoding, prefill). Decoding's from the spells that mostly decoded: measured over
        predicted seconds, their small prefill taken at its price; prefill's from the spells
        that prefilled, their decoding taken out at decoding's slowdown. Each pulled towards
        1 by SLOWDOWN_PULL seconds. Kept apart because a wave of prompts priced wrong is a
        wrong prefill price, not slow decoding (one ratio for both let a single wave make plain
        decoding look twice as slow as it decodes); fitted in that order because a wave's
        spell has almost no decoding to tell the two apart by.
        Decoding's is the pace of its steps against their prediction divided by its tokens'
        share of what was expected at the draft lengths they ran, that share pulled towards 1 as if
        LUCK_PULL_DRAWS more request-steps had given just what was expected. A step's tokens
        are partly chance (1 to k + 1), and the acceptance estimate already prices what
        acceptance really is; taken whole, a few seconds of one request's bad luck read as
        the layout's pace: at C = 1 in the memory-bound stand-in, sd read 1.29 from 7 s of
        it (its steps on time), was left for plain decoding it outran by a quarter, and
        stayed out for the rest of the run. A shortfall that lasts still shows, in part
        where few request-steps are kept: at C = 1, SPELLS_KEPT spells of two steps or so
        weigh it by half.
        At a given load (`running`) only the spells planned for about that many requests are
        read (NEAR_LOAD), where they are enough; otherwise all of them: how far a layout's
        steps stray from the model moves with the load (the batch's split into psd's halves,
        its prompts' share), and a reading at one load priced another."""
        recent = self._recent(layout)
        if not self._enough(layout, recent):
            return 1.0, 1.0
        if running is not None and self._enough(layout, near := self._recent(layout, running=running)):
            recent = near
        costs = self.costs()
        read_from = (costs, recent[0].ended, recent[-1].ended, len(recent))
        key = (layout, running)
        if key in self._slowdowns_read and self._slowdowns_read[key][0] == read_from:
            return self._slowdowns_read[key][1]
        step_times: dict[tuple[int, ...], float | None] = {}
        predicted = [(*self._predicted_s(layout, spell, costs, step_times), spell.seconds, spell) for spell in recent]
        pull_d, pull_p = SLOWDOWN_PULL
        decoding = [row for row in predicted if row[1] <= 0.5 * row[0]]
        pace = (sum(m - p for _, p, m, _ in decoding) + pull_d) / (sum(d for d, _, _, _ in decoding) + pull_d)
        pace = min(3.0, max(0.5, pace))
        expected = sum(spell.expected for _, _, _, spell in decoding)
        share = sum(spell.tokens for _, _, _, spell in decoding) / expected if expected > 0 else 1.0
        pull = LUCK_PULL_DRAWS / max(1, sum(spell.draws for _, _, _, spell in decoding))
        s_d = min(3.0, max(0.5, pace * (1 + pull) / (share + pull)))
        prefilling = [(d, p, m) for d, p, m, _ in predicted if p > 0]
        s_p = (sum(m - pace * d for d, _, m in prefilling) + pull_p) / (sum(p for _, p, _ in prefilling) + pull_p)
        self._slowdowns_read[key] = read_from, (s_d, min(3.0, max(0.5, s_p)))
        return self._slowdowns_read[key][1]

    def _planning_slowdowns(self, running: int | None = None) -> dict[str, tuple[float, float]]:
        """Each layout's (decoding, prefill) slowdown as the plan prices it: its own, except
        that a drafting layout not measured enough to read one (see _enough) is priced at
        least at plain decoding's measured decoding slowdown. Part of what plain decoding's
        reading holds slows every layout (gaps between a closed loop's requests, the gateway's
        work beside the verifier's threads, another process on the cores), and an unmeasured
        layout priced at 1 beside it looked ahead by that much: at C = 1 on the bundled pair
        (d5f5b0e) plain decoding read 1.17-1.20 slow while sd, whose spells were trials of
        drafting for fresh requests or followed the idle moment between two requests (neither
        counted), stood at 1, was settled on it for two thirds of a pass, and delivered what
        plain decoding did, less the switches. Not the other way: a drafting layout's reading
        never prices plain decoding, the floor auto must not lose to.
        At `running` requests (see _slowdowns) a drafting layout measured too little at about
        that load is priced so too, at its reading over every load where that is worse: a
        reading at one load stood for psd at another beside plain decoding's own there (in
        one server at C = 64, after runs at C = 4 to 32, psd was chosen outright at 1.12x
        plain decoding's price, and auto came to 0.88 of fixed `ar`)."""
        read = {layout: self._slowdowns(layout, running) for layout in LAYOUTS}
        if not self._enough("ar", self._recent("ar")):
            return read
        floor = max(1.0, read["ar"][0])
        priced = dict(read)
        for layout in LAYOUTS:
            if layout != "ar" and not self._enough(layout, self._recent(layout, running=running)):
                priced[layout] = (max(floor, read[layout][0]), read[layout][1])
        return priced

    def costs(self) -> StepCosts:
        return self.model.costs()

    # ---- planning --------------------------------------------------------------------------
    def replan_due(self, running: int) -> bool:
        """Every replan_interval_s, and at once when the requests running have changed by a
        quarter or more since the last plan (a burst must not run under a plan made for few)
        or the first request after idling came (its spell begins with it: see idle)."""
        if self.cycle_steps:
            return self._steps >= self.cycle_steps * (self.replans + 1) or not self.replans
        return (not self._steady or self._moved(running)
                or time.monotonic() - self._planned_at >= self.replan_interval_s)

    def _moved(self, running: int) -> bool:
        return abs(running - self._planned_for) >= max(2, 0.25 * self._planned_for)

    def replan(self, requests: list[ActiveRequest], k_cap: int) -> Plan:
        """A new plan for these requests. k_cap: the longest draft any request may get now
        (0 while no drafter can draft)."""
        now = time.monotonic()
        self._end_spell(now)
        if self._idle_since is not None:
            self._idle_spans.append((self._idle_since, now))
            self._idle_since = None
        # Whether the plan in force was a layout's trial: ending one is not leaving that layout
        # (see _held_back); with plain decoding held (FLOOR_MEASURED_S), a trial that measured
        # a layout well ended in plain decoding, and the layout was then held back for 15 s.
        outgoing_trial = self._exploring is not None and self.plan.layout == self._exploring.layout
        if self._steady:                    # the plan in force ran requests until now
            ran = now - self._planned_at
            # A layout's first measurement is free of the budget (see _may_explore), and so is
            # a trial's running on to be confirmed (CONFIRM_S): only re-checks spend it.
            tried = (outgoing_trial and not self._exploring.free and self._exploring.confirming is None)
            decay = math.exp(-ran / EXPLORE_WINDOW_S)
            self._running_s = self._running_s * decay + ran
            self._trial_s = self._trial_s * decay + (ran if tried else 0.0)
        moved = self._moved(len(requests))
        if moved:
            self._exploring = None          # a trial begun for other requests: decide afresh
        self._planned_at = now
        self._planned_for = len(requests)
        self.replans += 1
        if self.cycle_steps:
            plan = Plan(LAYOUTS[self.replans % len(LAYOUTS)], {}, ((),), 0.0, 0.0, threshold=0.0, cap=k_cap)
        else:
            wanted = self._wanted(requests, k_cap)
            slowdowns = self._planning_slowdowns(len(requests))
            slowdown = {layout: s[0] for layout, s in slowdowns.items()}
            prefill_slowdown = {layout: s[1] for layout, s in slowdowns.items()}
            switch_s, meanwhile = self._switch_s(requests)
            switching = dict(switch_s=switch_s, horizon_s=SWITCH_HORIZON_S, meanwhile_tokens_per_s=meanwhile)
            best = choose_plan(self.costs(), wanted, k_cap, layouts=self._layouts(len(requests)), slowdown=slowdown,
                               prefill_slowdown=prefill_slowdown,
                               **switching)
            if self._held_back(best.layout, requests, now):
                others = tuple(layout for layout in best.considered
                               if not self._held_back(layout, requests, now))
                best = replace(choose_plan(self.costs(), wanted, k_cap, layouts=others, slowdown=slowdown,
                                           prefill_slowdown=prefill_slowdown, **switching), considered=best.considered)
            if "ar" in best.considered and self._plain_delivers_more(best.layout, len(requests)):
                best = replace(choose_plan(self.costs(), wanted, k_cap, layouts=("ar",), slowdown=slowdown,
                                           prefill_slowdown=prefill_slowdown, **switching), considered=best.considered)
            if len(requests) >= self._settled_for:
                self._fewer_since = None
            elif self._fewer_since is None:
                self._fewer_since = now
            # No trial starts as a wave of requests comes in: it would be judged on their prefill.
            trying = None if moved else self._layout_to_try(best, len(requests))
            if trying is None:
                kept = self._layout_to_keep(best, len(requests))
                if kept is None:
                    if (self._settled == "ar") != (best.layout == "ar"):     # plain decoding left or back
                        self._floor_wait = FLOOR_FIRST_RECHECK_S if self._settled == "ar" else None
                    self._settle(best.layout, len(requests))
                if self._wave_settled is None or len(requests) >= self._wave_settled[1]:
                    self._wave_settled = (self._settled, len(requests))
                self._recheck_after.pop(self._settled, None)
            self._follow_load(len(requests), now)
            stay = trying or self._settled
            plan = best
            if stay != best.layout and stay in best.considered:      # (a layout may not apply now)
                plan = choose_plan(self.costs(), wanted, k_cap, layouts=(stay,), slowdown=slowdown,
                                   prefill_slowdown=prefill_slowdown, **switching)
                plan = replace(plan, considered=best.considered)
            trial, self._request_trial = self._request_trial, None
            hoping = plan.layout == "ar" and not moved and trying is None and self._fewer_since is None
            fresh = self._fresh(requests, k_cap)
            if trial is not None and not (hoping and now < trial[0] and not trial[1].isdisjoint(fresh)):
                if hoping or (plan.layout != "ar" and trying is None):     # (not ended by a load
                    self._trial_outcome(drafting=not hoping, now=now)       # change or a layout's trial)
                trial = None
            if hoping and fresh:
                found = self._hopeful_plan(requests, fresh, k_cap, plan, best.considered, trial, now,
                                           slowdown=slowdown, prefill_slowdown=prefill_slowdown, **switching)
                if found is not None:
                    hopeful, self._request_trial = found
                    plan, trying = replace(hopeful, considered=best.considered), hopeful.layout
                    self.request_trials += self._request_trial is not trial
            self.history.append(generation_pb2.PlanDecision(
                at_s=time.perf_counter() - self.clock_origin, layout=plan.layout, trying=trying or "",
                requests=len(requests), layout_tokens_per_s=best.considered))
        switched = plan.layout != self.plan.layout
        if switched:
            self._settling = SETTLE_STEPS[plan.layout]
            self._settle_until = now + SETTLE_S[plan.layout]
            # (Setting a layout aside for a trial is not leaving it, nor is ending its trial.)
            if self.plan.layout != "ar" and not self._exploring and not outgoing_trial:
                self._left[self.plan.layout] = (now, frozenset(r.request_id for r in requests))
        if requests and not self.cycle_steps:
            settled = not self._settling and now >= self._settle_until and self._request_trial is None
            after_idle = settled and not self._steady
            if after_idle:
                self._settling = AFTER_IDLE_STEPS[plan.layout]
            self._spell = _Spell(plan.layout, now, tuple(plan.draft_lengths.get(r.request_id, 0) for r in requests),
                                 plan.decode_tokens_per_s * plan.step_s, counted=self._steady and settled,
                                 after_idle=after_idle)
        self._steady = bool(requests)
        if switched:
            self.layout_switches += 1
            costs = self.costs()
            logger.info("auto: %s -> %s for %d requests (predicted tok/s %s; delivered %s; slowdown of decoding, "
                        "prefill %s; plain decoding priced on the %s cores, lending judged %s%s)",
                        self.plan.layout, plan.layout, len(requests), {k: round(v) for k, v in plan.considered.items()},
                        {k: round(v) for k, v in self._delivered_rates(len(requests)).items()},
                        {k: tuple(round(x, 2) for x in self._slowdowns(k, len(requests))) for k in LAYOUTS},
                        "lent" if costs.lending_pays else "own",
                        "-" if costs.lending_judged is None else f"{costs.lending_judged:.2f}",
                        f"; trying {self._exploring.layout} ({self._exploring.why})" if self._exploring
                        else "; trying it for requests not yet measured" if self._request_trial else "")
        self.plan = plan
        return plan

    def _follow_load(self, running: int, now: float) -> None:
        """The re-checks' doubled waits are cleared (back to the usual pace) once the load has
        been beyond a factor of two of the one they were doubled at for LOAD_MOVED_S of
        serving: another load, whose layouts were not the ones measured. Not at a moment's
        dip: cleared at every plan for another load, the waits were gone at each wave's tail
        and each first request after idling, and a layout measured briefly, tried again
        within seconds of serving, read close to plain decoding (within CONFIRM_WITHIN: a
        close contender's trial, free of the budget), had its trial cut short by the next
        wave's end and stayed unmeasured: at C = 8 and 16 in the paired bench, trials of psd
        or sd in most passes, and auto at 0.85 of fixed `ar`, decoding plainly in 92-94% of
        its steps."""
        if _same_load(running, self._recheck_load):
            self._load_moved_since = None
        elif self._load_moved_since is None:
            self._load_moved_since = now
        elif self._serving_age(self._load_moved_since, now) >= LOAD_MOVED_S:
            self._recheck_after.clear()
            self._recheck_load = running
            self._load_moved_since = None

    def _layouts(self, running: int) -> tuple[str, ...]:
        """The layouts a plan for `running` requests chooses from: psd with one request runs as
        sd does (one batch empty), so it is one only where it is in force, to be kept through
        a moment of one request (at C = 2 a closed loop runs one between a request's end and
        the next's arrival, and psd, settled, was left for plain decoding at nearly every one
        of them, then held back); otherwise its measured slowdown, read at two or more,
        would price sd's steps."""
        if running >= 2 or "psd" in (self._settled, self.plan.layout):
            return LAYOUTS
        return tuple(layout for layout in LAYOUTS if layout != "psd")

    def _held_back(self, layout: str, requests: list[ActiveRequest], now: float) -> bool:
        """Whether `layout` is not to be chosen on the model's word now: a drafting layout the
        plan moved off less than HELD_BACK_S ago at about this load, for requests some of which
        still run, and not measured since (a re-check that measured it lifts this). Never the
        settled layout. Once every request it was left for has finished, the prediction that
        left it no longer speaks for those running: in the memory-bound stand-in at C = 1 one
        request's few rejected drafts put sd below plain decoding, and the next requests, sd
        predicted 22% ahead for them, ran plainly for the rest of the 15 s (sd: 1.16x plain)."""
        left = self._left.get(layout)
        return (left is not None and layout != self._settled and now - left[0] < HELD_BACK_S
                and _same_load(len(requests), len(left[1])) and self._last_measured(layout) <= left[0]
                and any(r.request_id in left[1] for r in requests))

    def _switch_s(self, requests: list[ActiveRequest]) -> tuple[dict[str, float], float]:
        """What moving from plain decoding to a drafting layout costs once: the drafter
        catches up with every token verified since it last drafted (all of a request it never
        drafted for), at its measured price per catch-up token; -> (that time per layout, the
        tokens per second plain decoding delivers on the verifier's own cores meanwhile, where
        the catch-up runs beside it: StepCosts.catch_up_pays)."""
        if self.plan.layout != "ar":
            return {}, 0.0
        costs = self.costs()
        tokens = sum(r.drafter_catch_up for r in requests if r.max_draft != 0)
        catch_up = costs.draft_per_new_token * tokens
        meanwhile = 0.0
        if requests and costs.catch_up_pays(tokens, len(requests)):
            meanwhile = len(requests) / costs.verify([0] * len(requests))
        return {"sd": catch_up, "psd": catch_up}, meanwhile

    def _layout_to_try(self, best: Plan, running: int) -> str | None:
        """A contender not measured lately (or the one being tried, until it has been)."""
        now = time.monotonic()
        if self._exploring is not None:
            layout, since, _, confirming, delivering, _ = self._exploring
            measured = self._enough(layout, self._recent(layout, since))
            if delivering and layout in best.considered and now - since < FLOOR_DELIVERY_MAX_S \
                    and self._delivered_since(layout, running, since) is None:
                return layout
            if layout in best.considered and not measured and now - since < self._trial_cap_s(layout):
                return layout
            if measured and self._to_confirm(layout, best, since, now):
                if confirming is None:
                    self._exploring = self._exploring._replace(confirming=now)
                return layout
            self._exploring = None
            if not delivering:          # (what a re-check is reserved at: see _may_explore)
                self._trial_length_s = (now if confirming is None else confirming) - since
            if measured:                            # the fresh measurement replaces the old one
                spells = self._measured[layout]
                while spells and spells[0].ended < since:
                    spells.popleft()
            if delivering and self._delivered_since(layout, running, since) is not None:
                # ... and so does what it delivered at this load (another load's reading stays)
                self._delivered[layout] = deque((spell for spell in self._delivered[layout]
                                                 if spell.ended >= since or not _near_load(spell, running)),
                                                maxlen=SPELLS_KEPT)
        if self._load_dropped(now):
            return None
        if self._floor_unproven(best, running, now):
            self._floor_delivery_tried[running] = now
            self._exploring = _Trial("ar", now, free=True, delivering=True, why="to measure what it delivers")
            self.explorations += 1
            return "ar"
        best_slowdown = self.slowdown(best.layout, running)
        # The best is tried only to measure it, while the settled layout may keep it out on the
        # margin at the load it was settled for (_layout_to_keep): at C = 1 with 140 ms steps sd
        # was predicted 7% ahead of plain decoding and not run for 12 s, its prediction never put
        # to the test. So it is where too little of it was measured lately for MEASURED_MARGIN
        # to judge it against a settled layout measured that long (at C = 2 psd, priced from a
        # 0.6 s first trial at 0.92-1.04 of plain decoding and at times the best, was never run
        # again). Not while
        # fewer requests run than the settled layout was chosen for (a wave's first or last
        # request keeps it untried), nor at another load; the plain decoding a server starts
        # with was chosen for none.
        at_its_load = self._settled_for == 0 or self._settled_for <= running <= 2 * self._settled_for
        for layout, rate in best.considered.items():
            if layout == "psd" and running < 2:         # (it runs as sd: see _layouts)
                continue
            unmeasured = not self._enough(layout, self._recent(layout))
            if layout == best.layout and (layout == self._settled or not at_its_load
                                          or not (unmeasured or self._confirmable(layout, now))):
                continue
            # A trial needs a chance of winning: the layout's rate were it to run no slower
            # against the cost model than the best does (its own measured slowdown, where
            # worse, set aside: a re-check doubts it) must come within EXPLORE_WITHIN of the
            # best. Waiting alone is no reason: trials of layouts that lost even so ran a fifth
            # to a half slower than the plan for up to a second of every short run, and won
            # nothing. A layout never measured is tried from further behind: a prediction
            # can be far off (at C = 32 plain decoding's was 0.81-0.9 of psd's and a quarter
            # below what it delivered, so psd ran at 0.83 of it), and a first measurement is
            # best made early, while the server starts (with 0.9, predictions drifting near
            # it started psd's and sd's first trials in the 6th second at C = 4, a quarter
            # of a short run; with 0.75, psd predicted at 0.72 of plain decoding on the
            # acceptance prior was first tried 5 s into the bench's warm-up at C = 8, and
            # the trials and what they taught moved into the 3 s measured run).
            within = FIRST_EXPLORE_WITHIN if unmeasured else EXPLORE_WITHIN
            doubted = rate * max(1.0, self.slowdown(layout, running) / best_slowdown)
            wait = self._recheck_after.get(layout, self._recheck_wait(layout))
            age = self._serving_age(self._last_measured(layout), now)
            # Plain decoding, the floor, is also re-checked when its numbers may be what keeps
            # it out: not measured for FLOOR_STALE_S (or its wait, if longer) whatever its
            # prediction, and once due when only its own measured slowdown keeps it out (were it
            # no slower than the best, it would be ahead). Neither reserves the latest trial's
            # length in the budget first: after ten seconds of another process taking both
            # cores at C = 64, its slowdown read 3.0 (two-thread steps are hit hardest), and
            # psd ran at about 0.8 of it for half a minute after that process had ended while
            # the re-check waited on a 1.5 s trial made during it.
            floor = layout == "ar" and self._settled != "ar"
            overdue = floor and age > max(FLOOR_STALE_S, wait)
            if doubted < within * best.tokens_per_s and not overdue:
                continue
            floor_doubted = floor and (overdue or doubted > best.tokens_per_s)
            soon = (floor and self._floor_wait is not None and doubted > best.tokens_per_s
                    and age > self._floor_wait)
            close = self._close(layout, best, now)
            if self._measured[layout] and not soon and not close and not self._may_explore(reserve=not floor_doubted):
                continue
            stale = age > wait
            if unmeasured or stale or soon:
                if soon:            # the early re-checks after leaving it: ever later, then as overdue
                    self._floor_wait = 4 * self._floor_wait if 4 * self._floor_wait < FLOOR_STALE_S else None
                elif stale:         # re-checked again and again only while it keeps losing: ever rarer
                    self._recheck_after[layout] = min(RECHECK_MAX_S, 2 * wait)
                why = ("first measurement" if not self._measured[layout] else "not measured lately" if unmeasured
                       else "early re-check of the floor" if soon else "floor overdue" if overdue
                       else "close contender" if close else "re-check")
                self._exploring = _Trial(layout, now, free=close or not self._measured[layout], why=why)
                self.explorations += 1
                return layout
        return None

    def _load_dropped(self, now: float) -> bool:
        """Whether fewer requests than the settled layout was chosen for run, since less than
        LOAD_DROP_S: the moment between a request's end and the next one's arrival in a closed
        loop, or a wave's first or last requests. The settled layout is kept through it
        (_layout_to_keep), and no new trial starts in it (nor does a trial for fresh requests):
        it would be priced for a load that is gone within milliseconds and then run at the
        usual one. At C = 2 the plans that fell in such a moment, one request
        running, put plain decoding (priced 85 tok/s against sd's 100, its slowdown 1.59 against
        sd's 1.14) ahead were it no slower than sd, and began a re-check of it; each ran on at
        two requests, 0.6 of psd's pace there, until measured: four in one server's warm-up
        and six paired passes."""
        return self._fewer_since is not None and now - self._fewer_since < LOAD_DROP_S

    def _floor_unproven(self, best: Plan, running: int, now: float) -> bool:
        """Whether plain decoding is to be tried now to measure what it delivers end to end at
        about `running` requests (FLOOR_DELIVERY_MAX_S): a drafting layout is settled at about
        that load and delivered a rate there, plain decoding has not been measured there since
        that layout was settled nor for CONFIRM_S all told (_plain_delivers_more judges the
        two; a short older reading may be the server's first seconds: at C = 16 plain decoding
        delivered 579 tok/s over 1 s of the warm-up against 900-980 in fixed `ar`, and psd, at
        810, was settled on it for a pass and a half), and no such trial was made at about that
        load within FLOOR_STALE_S of serving. Not while fewer requests run than the settled layout
        was chosen for (a wave's tail), nor where the model puts plain decoding ahead (it is
        chosen on that) or out of reach (below EXPLORE_WITHIN of the best: any trial needs a
        chance of winning)."""
        settled = self._settled
        if settled == "ar" or best.layout == "ar" or not self._settled_for <= running <= 2 * self._settled_for:
            return False
        if best.considered.get("ar", 0.0) < EXPLORE_WITHIN * best.tokens_per_s:
            return False
        if self._delivered_rate(settled, running) is None or self._delivered_over("ar", running)[1] >= CONFIRM_S:
            return False
        if self._delivered_since("ar", running, self._settled_at) is not None:
            return False
        return not any(1 / NEAR_LOAD <= load / running <= NEAR_LOAD
                       and self._serving_age(at, now) < FLOOR_STALE_S
                       for load, at in self._floor_delivery_tried.items())

    def _to_confirm(self, layout: str, best: Plan, since: float, now: float) -> bool:
        """Whether a trial of `layout` begun at `since`, measured enough to be judged, is to
        run on until CONFIRM_S of it is measured: it reads within CONFIRM_WITHIN of the settled
        layout but not past the margin that would have it chosen as measured so far (more of
        it measured may decide either way), the settled layout is measured well enough itself
        for MEASURED_MARGIN to judge the two, and the trial is under CONFIRM_MAX_S old."""
        settled = best.considered.get(self._settled)
        if layout == self._settled or settled is None or now - since >= CONFIRM_MAX_S:
            return False
        # (What the trial measures replaces the layout's older spells when it ends: under
        # CONFIRM_S of it, a drafting layout is judged on the wide margin.)
        margin = TO_PLAIN_MARGIN if layout == "ar" else SWITCH_MARGIN
        return (CONFIRM_WITHIN * settled <= best.considered.get(layout, 0.0) < margin * settled
                and self._measured_s(layout, since) < CONFIRM_S and self._well_measured(self._settled, now))

    def _close(self, layout: str, best: Plan, now: float) -> bool:
        """Whether `layout` is a close contender, whose trial is free of the trial budget: it
        reads within CONFIRM_WITHIN of the settled layout, and measuring it for CONFIRM_S
        would let MEASURED_MARGIN judge the two (_confirmable). Its trial costs at most that
        3% while it runs (and runs on to be confirmed, CONFIRM_MAX_S at most), where the
        budget held it to a first trial's 0.6 s for a server's life: at C = 2 psd k=4 ran at
        1.05-1.09 of fixed `ar` in a paired run, and auto, pricing psd from that trial at 0.98
        of plain decoding, decoded plainly throughout."""
        settled = best.considered.get(self._settled)
        return (settled is not None and layout != self._settled
                and best.considered.get(layout, 0.0) >= CONFIRM_WITHIN * settled and self._confirmable(layout, now))

    def _well_measured(self, layout: str, now: float, running: int | None = None) -> bool:
        """Whether CONFIRM_S of `layout` was measured within the last SLOWDOWN_SPAN_S of serving (at
        about `running` requests, if given): enough for MEASURED_MARGIN to judge it."""
        return self._measured_s(layout, self._span_start(now), running) >= CONFIRM_S

    def _confirmable(self, layout: str, now: float) -> bool:
        """Whether measuring `layout` for CONFIRM_S would let MEASURED_MARGIN judge it against
        the settled layout: the settled one is well measured, and `layout` is not."""
        return self._well_measured(self._settled, now) and not self._well_measured(layout, now)

    def _switch_margin(self, layout: str, now: float, running: int) -> float:
        """How much faster than the settled layout a drafting `layout` must be predicted to be
        chosen over it for `running` requests: SWITCH_MARGIN, or MEASURED_MARGIN where both
        are well measured at about that load."""
        if self._well_measured(layout, now, running) and self._well_measured(self._settled, now, running):
            return MEASURED_MARGIN
        return SWITCH_MARGIN

    def _may_explore(self, reserve: bool = True) -> bool:
        """Whether a layout measured before may be tried again now: re-checks so far took at
        most EXPLORE_SHARE of the running time, with this one counted at the latest trial's
        length if `reserve` (a trial lasts until enough of the layout is measured,
        and nothing is measured before the switch settles: after plain decoding, trials of a
        drafting layout took 0.7-1.7 s on the reference machine, not 0.3, and counted at 0.3
        they took a quarter of short runs).
        Every layout's first measurement is free of this, and its time is not counted: the
        choice needs one of each (counted, a first trial of a second or so at the start of a
        short run left no re-check for the rest of it, whatever that trial had measured), and
        so is a close contender's (_close), which runs about as fast as the settled layout. At
        low concurrency the layouts are predicted within 10-20% of each other, and
        re-checks each second made auto switch back and forth, paying each switch's drain
        and catch-up, and ran layouts worse than its own choice half the time."""
        return self._trial_s + (self._trial_length_s if reserve else 0.0) <= EXPLORE_SHARE * self._running_s

    def _trial_cap_s(self, layout: str) -> float:
        """How long a trial of `layout` may last at most: EXPLORE_MAX_S, or twice the time
        MEASURED_ENOUGH_DRAWS request-steps take at the plan's predicted pace where that is
        longer (a step of the plan verifies each of its requests once; psd's a cycle)."""
        plan = self.plan
        if layout == "ar" or plan.layout != layout or not plan.draft_lengths:
            return EXPLORE_MAX_S
        return max(EXPLORE_MAX_S, 2 * MEASURED_ENOUGH_DRAWS / len(plan.draft_lengths) * plan.step_s)

    def _recheck_wait(self, layout: str) -> float:
        """How long a layout's measurement stands before it is re-checked: the longer it was
        measured, the longer (a moment's measurement, say in the burst of a run's start,
        is too little to rule a layout out for long)."""
        return min(RECHECK_AFTER_S, max(RECHECK_MIN_S, RECHECK_PER_MEASURED * self._measured_s(layout)))

    def _serving_age(self, since: float, now: float) -> float:
        """Seconds from `since` to `now` with requests running: a measurement ages only while
        the server serves (what could change it is learnt only then, and an idle server has
        nothing to lose). Aged by the clock, a burst after a quiet spell began with re-checks:
        in the paired bench at C = 4 (each setting's runs 3 s in 15) two passes in four began
        with one of plain decoding, and auto read 0.87 of `ar`. In ten alternating runs of
        three servers (16 prompts a run), auto aged by the clock tried sd or psd in eight
        and read 0.94 of `ar` (median); aged by serving, 1.02, decoding plainly in nine."""
        idle = 0.0
        for start, end in self._idle_before(now):
            if end <= since:
                break
            idle += end - max(start, since)
        return now - since - idle

    def _idle_before(self, until: float):
        """The idle spells that began before `until`, cut off there, latest first (the one in
        progress included): what _serving_age and _span_start walk back through."""
        if self._idle_since is not None and self._idle_since < until:
            yield self._idle_since, until
        for start, end in reversed(self._idle_spans):
            if start < until:
                yield start, min(end, until)

    def _span_start(self, until: float, span: float = SLOWDOWN_SPAN_S) -> float:
        """When the `span` seconds of serving that end at `until` began: the windows that
        measurements are read over count serving time only, as their ages do (_serving_age).
        Counted by the clock, a layout measured before a quiet half-minute was no longer
        measured after it: in the paired bench at C = 4 (auto serving about 4 s in 35) plain
        decoding's delivered rate at four requests, measured for 3.5 s, was gone by the next
        pass, and psd, priced 10% ahead on the model's word, was chosen over it; and passes
        after such a gap began re-checks (a layout measured for little of the last half-minute
        of the clock is due soon) and trials of close contenders (two of six passes, 0.6-0.7 s
        of sd each)."""
        cursor, left = until, span
        for start, end in self._idle_before(until):     # (none overlap)
            if end >= cursor:
                cursor = start
                continue
            if cursor - end >= left:
                break
            left -= cursor - end
            cursor = start
        return cursor - left

    def _last_measured(self, layout: str) -> float:
        spells = self._measured[layout]
        return spells[-1].ended if spells else self._started

    def _settle(self, layout: str, running: int) -> None:
        if layout != self._settled:
            self._settled_at = time.monotonic()
        self._settled, self._settled_for = layout, running

    def _layout_to_keep(self, best: Plan, running: int) -> str | None:
        """The settled layout, unless the best is clearly better (no flapping on noise; plain
        decoding need only be a little better, TO_PLAIN_MARGIN) or the load is not the one it
        was chosen for, within a factor of two (sd settled for a wave's last request, kept on
        the margin, prefilled the next wave's 64 prompts as one batch).
        A layout only being tried never counts as settled: after its trial it must win outright.
        Fewer requests than it was chosen for keep it for LOAD_DROP_S whatever the best: at a
        wave's end in a closed loop one request ran alone for a few milliseconds, sd was
        best for it, and every wave paid two switches (the pipeline drained, the drafter
        caught up, the lent cores handed back).
        Plain decoding, settled, is kept whatever the best until FLOOR_MEASURED_S of it is
        measured lately (for FLOOR_HOLD_MAX_S at most): it is what auto must not lose to, and
        it runs meanwhile, so its measurement comes at no cost, where leaving it on a
        moment's reading of it cost seconds of a worse layout.
        And while it runs, the best must lead it past the margin in LEAD_PLANS plans in a row
        (one plan's price is a moment's: a request's first drafts, one ending)."""
        current = best.considered.get(self._settled)
        now = time.monotonic()
        if best.layout == "ar" and self._plain_delivers_more(self._settled, running):
            return None
        if current is not None and self._load_dropped(now):
            return self._settled
        if (current is not None and self._settled == "ar" and best.layout != "ar"
                and now - self._settled_at < FLOOR_HOLD_MAX_S
                and self._measured_s("ar", since=self._span_start(now)) < FLOOR_MEASURED_S):
            return "ar"
        margin = TO_PLAIN_MARGIN if best.layout == "ar" else self._switch_margin(best.layout, now, running)
        alone_in_psd = self._settled == "psd" and running < 2       # (sd's steps: see _layouts)
        at_its_load = current is not None and _same_load(running, self._settled_for) and not alone_in_psd
        if at_its_load and best.layout != self._settled and best.tokens_per_s < current * margin:
            return self._settled
        if at_its_load and best.layout != self._settled and self.plan.layout == self._settled:
            leading, plans, latest = self._leading
            in_a_row = plans + 1 if (leading, latest) == (best.layout, self.replans - 1) else 1
            self._leading = (best.layout, in_a_row, self.replans)
            if in_a_row < LEAD_PLANS:
                return self._settled
        return None

    def draft_length(self, req: ActiveRequest, k_cap: int) -> int:
        """The request's k this step: the plan's rule applied to its acceptance so far."""
        cap = self._max_draft(req, k_cap)
        if self.cycle_steps:
            varied = (zlib.crc32(req.request_id.encode()) + self._steps) % (cap + 1)
            return 0 if self.plan.layout == "ar" else varied
        if self.plan.layout == "ar" or cap == 0:
            return 0                        # (its reach is not worked out for every request every step)
        req.draft_reach = self.acceptance.reach(req.seq.stats, hopeful=self._request_trial is not None)
        return self.plan.draft_length(req.draft_reach, cap)

    def _fresh(self, requests: list[ActiveRequest], k_cap: int) -> list[str]:
        """The requests that may draft and have drafted too little to tell their acceptance
        (AcceptanceEstimate.fresh)."""
        return [r.request_id for r in requests if self._max_draft(r, k_cap) and self.acceptance.fresh(r.seq.stats)]

    def _hopeful_plan(self, requests: list[ActiveRequest], fresh: list[str], k_cap: int, plain: Plan,
                      considered: dict[str, float], trial: tuple[float, frozenset[str]] | None, now: float,
                      **planning) -> tuple[Plan, tuple[float, frozenset[str]]] | None:
        """A trial of drafting for the `fresh` requests, where the plan is plain decoding, which
        would never measure them (AcceptanceEstimate.fresh): the best drafting layout with one
        of them priced hopefully, if that is predicted TRIAL_MARGIN faster than `plain` and the
        hope is what puts it there (at its price as `considered`, the layout was not
        SWITCH_MARGIN faster: one chosen against for other reasons, say held back, stays so);
        -> (that plan, the trial: until when at most, for which requests), or None.
        Once begun (`trial`, the one still in force), it goes on while any request it was
        begun for is fresh, for the time of 2 * MIN_REQUEST_STEPS of its steps at most
        (EXPLORE_MAX_S at least): a request drafted badly would otherwise leave it after a
        step or two, never measured, and the requests measured, the good ones alone, would
        read as alike. Its spells are
        not counted: what it delivers is the hope's error, not the layout's pace. In the
        memory-bound stand-in at C = 1, half the requests drafted at 0.9 and half at 0.1:
        the pool's mean put sd level with plain decoding for every newcomer, auto decoded
        plainly throughout, and sd would have drafted the good half about twice as fast.
        One fresh request is priced hopefully, the others as they are: the hope is a request one
        standard deviation above the mean, about one in six, and every fresh request priced so
        at once put a batch's price a third above its realistic one at k_max = 8 on the
        bundled pair (hope 0.92 against conditional rates of 0.83 at every position): at C = 4
        every wave of four began a trial of psd at k = 7, 6 in 7 s, and auto came to 0.87 of
        `ar` in a sweep of fresh servers (docs/benchmarks.md, "Reading the results"). With
        one, a trial is begun where drafting would pay with one such request among them.
        The margin is wide because a trial's gain is the hope's, a standard deviation's worth:
        on the bundled pair, whose requests differ little, psd and plain decoding within 5% of
        each other at C = 2 and 4, a trial at SWITCH_MARGIN began for nearly every new request
        (every 0.4-0.6 s) and auto fell from 1.08 to 0.91 of the best fixed setting at C = 4.
        Trials that keep leaving the plan in plain decoding come ever more rarely (TRIAL_BACKOFF_S)."""
        ongoing = trial is not None
        if not ongoing and now - self._trial_ended < self._trial_wait_s:
            return None                 # (backing off: not worth a plan's search, asked every plan)
        hoped = next(r for r in fresh if r in trial[1]) if ongoing else fresh[0]
        hopeful = choose_plan(self.costs(), self._wanted(requests, k_cap, hopeful_for=hoped), k_cap,
                              layouts=tuple(x for x in self._layouts(len(requests)) if x != "ar"), **planning)
        if hopeful.layout == "ar":
            return None
        if ongoing:
            return hopeful, trial
        if (hopeful.tokens_per_s < TRIAL_MARGIN * plain.tokens_per_s
                or considered.get(hopeful.layout, 0.0) >= SWITCH_MARGIN * plain.tokens_per_s):
            return None
        steps_s = 2 * self.acceptance.MIN_REQUEST_STEPS * hopeful.step_s
        return hopeful, (now + max(EXPLORE_MAX_S, steps_s), frozenset(fresh))

    def _trial_outcome(self, drafting: bool, now: float) -> None:
        """A trial of drafting for fresh requests ended, and the plan after it drafts (on the
        numbers, not another such trial) or not: see TRIAL_BACKOFF_S."""
        if drafting:
            self._trial_wait_s = 0.0
        else:
            least, most = TRIAL_BACKOFF_S
            self._trial_wait_s = min(most, max(least, 2 * self._trial_wait_s))
            self._trial_ended = now

    def _wanted(self, requests: list[ActiveRequest], k_cap: int, hopeful_for: str | None = None) -> list[PlanRequest]:
        """The requests as the chooser takes them: each one's reach (request `hopeful_for`'s
        priced hopefully, see AcceptanceEstimate.reach) and its cap (_priced_draft)."""
        return [PlanRequest(r.request_id, self.acceptance.reach(r.seq.stats, hopeful=r.request_id == hopeful_for),
                            self._priced_draft(r, k_cap))
                for r in requests]

    @staticmethod
    def _max_draft(req: ActiveRequest, k_cap: int) -> int:
        """The longest draft the request may get this step: k_cap, its own cap, and never
        past its end (Sequence.draft_length: a step gives it at most the tokens it has left,
        and that is all it drafts)."""
        return req.seq.draft_length(req.draft_cap(k_cap))

    @staticmethod
    def _priced_draft(req: ActiveRequest, k_cap: int) -> int:
        """The cap a plan prices the request at: as _max_draft, but within its whole output
        (max_tokens), not what is left of it. A plan is a layout for the next seconds, and a
        request one or two steps from its end is one moment of it: priced at what it had
        left, psd at C = 2 stood at 0.70-0.88 of its usual rate in a quarter of the plans
        (one of its two requests ending), below plain decoding, and a settled psd was left at
        such a moment. Each step still drafts only what the request has left; what the last
        steps lose shows in drafting layouts' measured slowdowns, their spells measured
        against the plan's steps (a sixteenth of request-steps at k = 4 and 64-token outputs)."""
        return max(0, min(req.draft_cap(k_cap), req.seq.params.max_tokens - 1))

    # ---- showing ---------------------------------------------------------------------------
    def describe(self, planning: bool) -> tuple[generation_pb2.CostModel, generation_pb2.AutoPlan | None]:
        """The cost model (every mode) and, in auto mode, the plan in force."""
        c = self.costs()
        model = generation_pb2.CostModel(
            draft_fixed_s=c.draft_fixed, draft_per_forward_s=c.draft_per_forward, draft_per_token_s=c.draft_per_token,
            verify_fixed_s=c.verify_fixed, verify_per_token_s=c.verify_per_token,
            gateway_per_call_s=c.gateway_per_step, draft_calls=self.model.draft_calls,
            verify_calls=self.model.verify_calls, median_error=self.model.median_error,
            verify_borrowed_fixed_s=c.borrowed_fixed, verify_borrowed_per_token_s=c.borrowed_per_token,
            draft_per_new_token_s=c.draft_per_new_token, verify_per_new_token_s=c.verify_per_new_token,
            verify_borrowed_per_new_token_s=c.borrowed_per_new_token,
            prompt_tokens_per_s=self.model.prompt_tokens_per_s(), prompt_per_output=c.prompt_per_output,
            verify_per_request_s=c.verify_per_request, verify_borrowed_per_request_s=c.borrowed_per_request,
            lending_judged=c.lending_judged, data_plane_per_call_s=c.data_plane_per_step)
        if not planning:
            return model, None
        return model, generation_pb2.AutoPlan(
            layout=self.plan.layout, draft_lengths=list(self.plan.draft_lengths.values()),
            predicted_tokens_per_s=self.plan.tokens_per_s, layout_tokens_per_s=self.plan.considered,
            acceptance_reach=list(self.acceptance.pool_reach()),
            acceptance_prior_strength=self.acceptance.strength(), acceptance_spread=self.acceptance.spread(),
            request_trials=self.request_trials, replans=self.replans,
            layout_switches=self.layout_switches, explorations=self.explorations,
            layout_slowdown={layout: self.slowdown(layout, self._planned_for or None) for layout in LAYOUTS},
            layout_prefill_slowdown={layout: self.prefill_slowdown(layout, self._planned_for or None)
                                     for layout in LAYOUTS},
            layout_delivered_tokens_per_s=self._delivered_rates(self._planned_for),
            history=list(self.history))
