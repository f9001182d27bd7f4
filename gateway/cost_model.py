"""What a step costs, measured on the running services: the cost model auto mode plans with.

The services report their busy time per call (the step records). Two linear models, fitted
online by least squares with a weak prior so that a handful of calls already gives an answer:

  drafter  t(k_1..k_b) = a_t * max_i k_i + b_t * sum_i k_i + c_t + p_t * catch-up tokens
           (k_max sequential forwards; each costs a fixed part and a part per request drafting)
  verifier V(n)         = a_v + b_v * n + s_v * b + p_v * prompt tokens
                          (n = sum_i (k_i + 1) tokens verified, b requests: each request's
                           attention reads its own KV, whatever the tokens it verifies)

Prompt and catch-up tokens (requests new to a service, or back to drafting after a while) are
their own feature: a long chunk costs less per token than decoding, and folding both into one
slope skews the steady-state prediction the planner needs (which has none of them).

On the cores the idle drafter lends it (plain decoding in auto mode) the verifier runs the same
forwards with more threads: its time there is the own-core prediction times one measured ratio,
the median over recent lent-core calls. One robust number needs few calls; a fit of its own
had few points, collinear features (k = 0: tokens = requests) and took a slow first call
after a switch as a cost of every prompt token, which once made plain decoding look 2.5x
dearer than it was.

plus the gateway's own share per step (transport and bookkeeping), measured as wall time minus
busy time, and the data plane's: the verifier's time taking a step's drafts off it, as it
reports per call (the median). No constant is assumed about the hardware: a GPU's flat V
(memory-bound) and a CPU's steep one (compute-bound) come out of the same fit.
"""

from __future__ import annotations

import logging
import math
import time
from bisect import bisect_left, bisect_right
from collections import OrderedDict, deque
from dataclasses import dataclass
from operator import mul

logger = logging.getLogger("minedraft.gateway")

PROMPT_WINDOW_S = 10.0      # prompt arrivals are averaged over this long
PROMPT_MIN_SPAN_S = 1.0     # ... or since the oldest of them, but never over less than this
WORKLOAD_WINDOW = 64        # requests the prompt-per-output ratio is taken over
LENT_WINDOW = 24            # recent lent-core calls the ratio is the median of (a trial of plain
                            # decoding renews most of them)
LENT_JUDGED = 8             # lent-core decode calls, each beside own-core ones of about its batch,
                            # it takes to judge lending slower than the own cores; until then the
                            # lent cores are priced at most at the own cores' (the start-up profile
                            # measures two or three, each just after a switch, when threads wake)
OWN_PLAIN_KEPT = 64         # own-core plain decode calls kept to judge lending by
SAME_BATCH = 1.25           # batches within this factor of each other are compared ...
PAIRED_WITHIN_S = 3.0       # ... when they ran within this long of each other (the requests' contexts
                            # alike: the start-up profile's short ones made own-core steps look
                            # fast beside lent steps of real requests, and judged lending slower)
OWN_PARTNERS = 3            # own-core calls a lent call needs beside it to be compared
SLOWER_JUDGED_FOR_S = 60.0  # a judgement that lending slows plain decoding lapses this long after
                            # it was made, and lending is presumed again until judged afresh: while
                            # plain decoding runs it is judged again well within that (the Batch
                            # Manager lends a window of steps every 30 s, LEND_RECHECK_S); where
                            # nothing decoded plainly meanwhile it rests on old steps (made while
                            # another process held the cores, it priced plain decoding on one core
                            # for good, and auto ran psd at 0.86 of plain decoding at C = 8)
SWITCH_CALLS = 4            # verify calls after the verifier moves onto the lent cores or off them that
                            # measure the move, not the cores: left out of lending's ratio and its
                            # judgement (the first lent call after own-core ones took 1.35-1.6x the
                            # lent cores' usual time and the next three 1.1-1.2x; the first own-core
                            # call after lent ones 1.4-1.5x: the threads moving, OpenMP's worker
                            # waking or still spinning; windows of OWN_WINDOW own-core steps between
                            # lent ones judged lending slower at C = 8, where `ar` on both cores ran
                            # 10-25% faster than auto on its own core)
MAX_JITTER = 0.5            # the largest relative spread of a call's busy time the planner assumes
INTERCEPT_PRIOR_WEIGHT = 1e-6   # a fit's fixed cost is all but free of its prior (LinearFit): enough
                                # only to give it the prior's value before any call


def _median(values) -> float:
    """The middle value (the upper of the two middle ones for an even count); values must not be empty."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


class LinearFit:
    """y ~ w . x with every w >= 0 (each a price) by least squares over the last `window`
    observations, shrunk towards `prior` with weight `prior_weight` (ridge towards a guess,
    so early fits are sane), one weight for all features or one each. An intercept wants
    next to none: shrunk towards a guess of a few milliseconds, it leaves the slopes to make
    up the rest of every call's time, and with few calls they come out dear (the memory-bound
    stand-in's verifier, 100 ms a call plus 8 a token on one core, was fitted at 79 plus 13
    from its start-up profile's eight calls: each token beyond the first 60% dear, a plain
    step 15% cheap).
    Keeps the normal equations' sums, so an observation and a solve cost O(d^2) and O(d^3)
    for a handful of features, whatever the window: the gateway fits on every call."""

    def __init__(self, prior: tuple[float, ...], prior_weight: float | tuple[float, ...] = 1.0,
                 window: int = 512) -> None:
        d = len(prior)
        self.prior = prior
        self.prior_weight = (prior_weight,) * d if isinstance(prior_weight, (int, float)) else tuple(prior_weight)
        if len(self.prior_weight) != d:
            raise ValueError(f"expected {d} prior weights, got {len(self.prior_weight)}")
        self._rows: deque[tuple[tuple[float, ...], float]] = deque(maxlen=window)
        self._xtx = [[0.0] * d for _ in range(d)]
        self._xty = [0.0] * d
        self._weights: tuple[float, ...] | None = None
        self._held_at_zero: tuple[int, ...] = ()      # the weights the last solve held at 0

    def observe(self, features: tuple[float, ...], value: float) -> None:
        if len(features) != len(self.prior):
            raise ValueError(f"expected {len(self.prior)} features, got {len(features)}")
        if len(self._rows) == self._rows.maxlen:
            self._add(*self._rows[0], sign=-1.0)
        self._rows.append((features, value))
        self._add(features, value, sign=1.0)
        self._weights = None

    def _add(self, features: tuple[float, ...], value: float, sign: float) -> None:
        for i, x in enumerate(features):
            self._xty[i] += sign * x * value
            row = self._xtx[i]
            for j, z in enumerate(features):
                row[j] += sign * x * z

    @property
    def num_observations(self) -> int:
        return len(self._rows)

    @property
    def weights(self) -> tuple[float, ...]:
        if self._weights is None:
            self._weights = self._solve()
        return self._weights

    def predict(self, features: tuple[float, ...]) -> float:
        return sum(map(mul, self.weights, features))

    def _solve(self) -> tuple[float, ...]:
        """min |X w - y|^2 + sum_i l_i (w_i - prior_i)^2 over w >= 0 (_nonnegative_solve):
        every weight is a price, and the features are nearly collinear at one load (at C = 2
        in psd every verify is one request of five tokens but for a few slow ones of fewer).
        A fit left free there put a token at -0.8 ms and the fixed and per-request costs
        above the calls' mean to make up for it; with the token clamped to 0 afterwards, the
        usual call was priced at 12.4 ms against the 8.1 it took, and psd a third slow (the
        median error of verify predictions in four runs: 0.42-0.58 so, 0.07-0.21 kept >= 0)."""
        a = [[x + (self.prior_weight[i] if i == j else 0.0) for j, x in enumerate(row)] for i, row in enumerate(self._xtx)]
        rhs = [y + w * p for y, w, p in zip(self._xty, self.prior_weight, self.prior)]
        weights = _nonnegative_solve(a, rhs, self._held_at_zero)
        self._held_at_zero = tuple(i for i, w in enumerate(weights) if w == 0.0)
        return weights


def _solve_on(a: list[list[float]], rhs: list[float], free: list[int]) -> list[float]:
    """a w = rhs restricted to the `free` indices (the others 0), by Gaussian elimination with
    partial pivoting; a is symmetric positive definite (normal equations plus a ridge)."""
    m = [[a[i][j] for j in free] for i in free]
    r = [rhs[i] for i in free]
    n = len(free)
    for col in range(n):
        pivot = max(range(col, n), key=lambda row: abs(m[row][col]))
        m[col], m[pivot], r[col], r[pivot] = m[pivot], m[col], r[pivot], r[col]
        for row in range(n):
            if row != col and m[row][col]:
                factor = m[row][col] / m[col][col]
                m[row] = [x - factor * y for x, y in zip(m[row], m[col])]
                r[row] -= factor * r[col]
    w = [0.0] * len(rhs)
    for index, i in enumerate(free):
        w[i] = r[index] / m[index][index]
    return w


def _nonnegative_solve(a: list[list[float]], rhs: list[float], held: tuple[int, ...] = ()) -> tuple[float, ...]:
    """The w >= 0 minimising w.a.w / 2 - w.rhs (Lawson and Hanson's active set on the normal
    equations). Usually one solve: the free solution has no negative weight, or the weights
    `held` at 0 by the last fit are still the ones to hold (the gateway fits after every call,
    and at one load the same price stays at 0 call after call)."""
    d = len(rhs)
    tolerance = 1e-12 * max(1.0, *(abs(x) for x in rhs))
    for zero in (held, ()) if held else ((),):
        free = [i for i in range(d) if i not in zero]
        w = _solve_on(a, rhs, free)
        # Optimal if feasible and no weight held at 0 would lower the objective by rising.
        if min(w) >= 0.0 and all(rhs[i] - sum(a[i][j] * w[j] for j in range(d)) <= tolerance for i in zero):
            return tuple(w)
    w, free = [0.0] * d, []
    for _ in range(4 * d):                  # (it ends in a few rounds; bounded against rounding)
        gradient = [rhs[i] - sum(a[i][j] * w[j] for j in range(d)) for i in range(d)]
        rising = [i for i in range(d) if i not in free and gradient[i] > tolerance]
        if not rising:
            break
        free.append(max(rising, key=gradient.__getitem__))
        while free:
            s = _solve_on(a, rhs, free)
            blocking = [i for i in free if s[i] <= 0.0]
            if not blocking:
                w = s
                break
            # Step from w towards s until the first weight reaches 0; it leaves the free set.
            step, first = min((w[i] / (w[i] - s[i]) if w[i] > s[i] else 0.0, i) for i in blocking)
            w = [x + step * (y - x) for x, y in zip(w, s)]
            w[first] = 0.0
            free = [i for i in free if w[i] > 0.0]
            w = [x if i in free else 0.0 for i, x in enumerate(w)]
    return tuple(w)


def _lending_pays(judged: float | None) -> bool:
    """Whether plain decoding borrows the lent cores under this judgement (see
    StepCosts.lending_judged): unless it says they are slower."""
    return judged is None or judged <= 1.0


@dataclass(frozen=True)
class StepCosts:
    """A fitted model's answers, in seconds; what the planner needs and nothing else."""

    draft_per_forward: float        # a_t: each of the k_max sequential draft forwards
    draft_per_token: float          # b_t: each drafted token
    draft_fixed: float              # c_t
    verify_fixed: float             # a_v
    verify_per_token: float         # b_v
    gateway_per_step: float         # transport and bookkeeping around each call
    # Plain decoding on the cores lent by the idle drafter (None: nothing is lent yet); the
    # own-core coefficients times the measured ratio (see CostModel).
    borrowed_fixed: float | None = None
    borrowed_per_token: float | None = None
    draft_per_new_token: float = 0.0    # p_t: catch-up tokens
    verify_per_new_token: float = 0.0   # p_v: prompt tokens
    borrowed_per_new_token: float | None = None     # p_v on the lent cores too
    verify_per_request: float = 0.0     # s_v
    borrowed_per_request: float | None = None
    prompt_per_output: float = 0.0      # prompt tokens per output token of the recent workload
    # How far one call's busy time strays from its prediction, relative (a standard deviation):
    # what two overlapped calls cost beyond the longer prediction (planner.expected_max).
    jitter: float = 0.0
    # A step's verify goes out with its draft call and waits for the drafts at the verifier:
    # one gateway round trip a step, not two (BatchManager._step).
    early_verify: bool = False
    # Lent-core decode time over the own cores' prediction, what the lent cores are priced at
    # (None: not measured; at most 1 unless judged slower, below).
    lent_ratio: float | None = None
    # Lent-core decode time over own-core decode time measured at about the same batch (None:
    # too few such pairs). Above 1 the lent cores slow plain decoding down (their other work,
    # the gateway's and the clients', stalls two threads' barriers): it then runs on the
    # verifier's own cores.
    lending_judged: float | None = None
    # The verifier's time taking one drafting step's drafts off the data plane, before its
    # forward (its busy time leaves it out, and the gateway's share too): d in the step times
    # of sd and psd (planner.layout_step_s).
    data_plane_per_step: float = 0.0

    @property
    def lending_pays(self) -> bool:
        """Whether plain decoding should borrow the drafter's cores: unless measured slower,
        beside own-core plain steps of about the same batch. Never on the own-core fit alone:
        in plain decoding it is extrapolated from drafting steps (k > 0), and a trial of psd
        that reshaped it once read lending as slower and ran the rest of a run on one core
        (busy 8.3 ms a step against 6.6 lent)."""
        return _lending_pays(self.lending_judged)

    def plain_verify(self, ks: list[int], new_tokens: int = 0) -> float:
        """A plain-decoding step where it runs: on the lent cores if they pay, else the own."""
        return self.verify(ks, new_tokens, borrowed=self.lending_pays)

    def serving_rate(self, layout: str, decode_tokens_per_s: float, prefill_slowdown: float = 1.0) -> float:
        """Output tokens per second once every output token also carries its share of prompt
        prefill at this layout's price: 1 / (1 / decode + prompt per output x prefill price).
        Arrivals follow completions in a busy server, so the prefill grows with the rate
        itself; never a share of a second that could reach one."""
        if decode_tokens_per_s <= 0:
            return 0.0
        return 1.0 / (1.0 / decode_tokens_per_s
                      + self.prompt_per_output * self.prefill_per_token(layout) * prefill_slowdown)

    def prefill_per_token(self, layout: str) -> float:
        """What a prompt token costs the busiest service in this layout: ar prefills on the
        lent cores, sd on the verifier and then the drafter, psd on both at once."""
        if layout == "ar":
            return self.verify_per_new_token if self.borrowed_per_new_token is None else self.borrowed_per_new_token
        if layout == "sd":
            return self.verify_per_new_token + self.draft_per_new_token
        return max(self.verify_per_new_token, self.draft_per_new_token)

    def draft(self, ks: list[int], new_tokens: int = 0) -> float:
        """new_tokens: catch-up tokens the first forward carries besides the drafts (with
        every k 0, a call that only takes them in). Nothing to draft or take in: no call."""
        if not ks or (max(ks) == 0 and not new_tokens):
            return 0.0
        return (self.draft_fixed + self.draft_per_forward * max(ks) + self.draft_per_token * sum(ks)
                + self.draft_per_new_token * new_tokens)

    def catch_up_pays(self, tokens: int, batch: int) -> bool:
        """Whether the drafters' catch-up of `tokens` after plain decoding runs on a call of
        its own beside plain steps of the batch on the verifier's own cores, rather than in
        the first drafting step: when it takes longer than one such step (BatchManager._decode;
        at C = 64 on the reference machine a first drafting step after plain decoding took
        0.6 s, the verifier waiting on its drafts, against 0.03 s a plain step)."""
        return self.draft([0], tokens) > self.verify([0] * batch)

    def verify(self, ks: list[int], new_tokens: int = 0, borrowed: bool = False) -> float:
        """new_tokens: prompt tokens of requests new to the verifier, prefilled in the same forward."""
        if not ks:
            return 0.0
        tokens = sum(k + 1 for k in ks)
        if borrowed and self.borrowed_fixed is not None:
            fixed, per_token = self.borrowed_fixed, self.borrowed_per_token
            per_new_token = self.verify_per_new_token if self.borrowed_per_new_token is None \
                else self.borrowed_per_new_token
            per_request = self.verify_per_request if self.borrowed_per_request is None else self.borrowed_per_request
        else:
            fixed, per_token = self.verify_fixed, self.verify_per_token
            per_new_token, per_request = self.verify_per_new_token, self.verify_per_request
        return fixed + per_token * tokens + per_request * len(ks) + per_new_token * new_tokens


class CostModel:
    """Online fits of the drafter's and the verifier's busy time (own cores, and lent cores
    when the verifier borrows them), and of the gateway's share."""

    def __init__(self, prior: StepCosts | None = None) -> None:
        prior = prior or StepCosts(1e-3, 1e-4, 1e-3, 5e-3, 5e-4, 5e-4)
        # A prompt token is guessed at a drafted or verified one's price unless the prior says.
        self._draft = LinearFit((prior.draft_per_forward, prior.draft_per_token, prior.draft_fixed,
                                 prior.draft_per_new_token or prior.draft_per_token),
                                prior_weight=(1.0, 1.0, INTERCEPT_PRIOR_WEIGHT, 1.0))
        self._verify = LinearFit((prior.verify_fixed, prior.verify_per_token,
                                  prior.verify_per_new_token or prior.verify_per_token, prior.verify_per_request),
                                 prior_weight=(INTERCEPT_PRIOR_WEIGHT, 1.0, 1.0, 1.0))
        self._lent: deque[tuple[tuple[float, ...], float]] = deque(maxlen=LENT_WINDOW)  # (features, busy)
        self._lent_prefills: deque[tuple[tuple[float, ...], float]] = deque(maxlen=LENT_WINDOW)   # ... with prompts
        # Plain decode calls (k = 0, no prompts) on each side: (when, batch, busy).
        self._own_plain: deque[tuple[float, int, float]] = deque(maxlen=OWN_PLAIN_KEPT)
        self._lent_plain: deque[tuple[float, int, float]] = deque(maxlen=LENT_WINDOW)
        self._lending_judged: float | None = None      # the latest judgement (see _judge_lending) ...
        self._lending_judged_at = float("-inf")         # ... and when it was made
        self._lending_doubted_at: float | None = None   # a first reading of lending as slower, unconfirmed
        # The cores of the latest verify calls (lent or not) and how many ran there in a row: the
        # verifier starts on its own, no move to measure.
        self._cores = (False, SWITCH_CALLS)
        self._gateway: deque[float] = deque([prior.gateway_per_step], maxlen=256)
        self._data_plane: deque[float] = deque([prior.data_plane_per_step], maxlen=256)
        self.early_verify = prior.early_verify      # set by the Batch Manager
        self._errors: deque[float] = deque(maxlen=256)      # |predicted - measured| / measured
        self._prompts: deque[tuple[float, int]] = deque()    # (when, prompt tokens) arriving at the verifier
        # The last WORKLOAD_WINDOW requests admitted: [prompt tokens, output tokens], the output
        # their max_tokens until they finish.
        self._workload: OrderedDict[str, list[int]] = OrderedDict()
        self._workload_sums = [0, 0]     # their prompt and output tokens (asked every step)
        # costs() is asked several times a step (each call's prediction and deadline, the
        # planner): its answer is kept until an observation changes it.
        self._changes = 0
        self.lent_observed_at = float("-inf")       # when a lent-core call last came back
        self._cached: tuple[tuple[int, bool], StepCosts] | None = None
        self._refused: set[str] = set()             # kinds of report dropped (see _reported)

    def observe_admitted(self, request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        self.observe_prompts(prompt_tokens)
        self._changes += 1
        self._forget_workload(request_id)
        self._workload[request_id] = [prompt_tokens, max_tokens]
        self._workload_sums[0] += prompt_tokens
        self._workload_sums[1] += max_tokens
        while len(self._workload) > WORKLOAD_WINDOW:
            self._forget_workload(next(iter(self._workload)))

    def _forget_workload(self, request_id: str) -> None:
        prompt, output = self._workload.pop(request_id, (0, 0))
        self._workload_sums[0] -= prompt
        self._workload_sums[1] -= output

    def observe_finished(self, request_id: str, output_tokens: int) -> None:
        if request_id in self._workload:
            self._workload_sums[1] += output_tokens - self._workload[request_id][1]
            self._workload[request_id][1] = output_tokens
            self._changes += 1

    def prompt_per_output(self) -> float:
        """Prompt tokens over output tokens of the last requests admitted (a running request's
        max_tokens stands in for its output): one odd request (a warm-up of four tokens)
        moves it little."""
        prompt, output = self._workload_sums
        return prompt / max(1, output)

    def observe_prompts(self, tokens: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._prompts.append((now, tokens))
        while self._prompts and self._prompts[0][0] < now - PROMPT_WINDOW_S:
            self._prompts.popleft()

    def prompt_tokens_per_s(self, now: float | None = None) -> float:
        """Over the last PROMPT_WINDOW_S, or since the oldest arrival in it (at least a second):
        a burst after an idle spell counts at its own rate, not spread over the quiet before."""
        now = time.monotonic() if now is None else now
        recent = [(when, n) for when, n in self._prompts if when >= now - PROMPT_WINDOW_S]
        if not recent:
            return 0.0
        return sum(n for _, n in recent) / max(PROMPT_MIN_SPAN_S, now - recent[0][0])

    @property
    def draft_calls(self) -> int:
        return self._draft.num_observations

    @property
    def verify_calls(self) -> int:
        return self._verify.num_observations + len(self._lent)

    def observe_draft(self, ks: list[int], busy_s: float, new_tokens: int = 0, predicted: float | None = None) -> None:
        """predicted: what the model said when the call was made (default: what it says now)."""
        if ks and (max(ks) > 0 or new_tokens) and self._reported("the drafter's busy_s", busy_s):
            self._track(self.costs().draft(ks, new_tokens) if predicted is None else predicted, busy_s)
            self._changes += 1
            self._draft.observe((float(max(ks)), float(sum(ks)), 1.0, float(new_tokens)), busy_s)

    def observe_verify(self, ks: list[int], busy_s: float, new_tokens: int = 0, borrowed: bool = False,
                       predicted: float | None = None) -> None:
        if ks and self._reported("the verifier's busy_s", busy_s):
            self._track(self.costs().verify(ks, new_tokens, borrowed) if predicted is None else predicted, busy_s)
            self._changes += 1
            features = (1.0, float(sum(k + 1 for k in ks)), float(new_tokens), float(len(ks)))
            now = time.monotonic()
            plain = not new_tokens and not any(ks)
            in_a_row = self._cores[1] + 1 if self._cores[0] == borrowed else 1
            self._cores = (borrowed, in_a_row)
            settled = in_a_row > SWITCH_CALLS          # (the move of threads measured, not the cores)
            if borrowed:
                self.lent_observed_at = now
                if settled:
                    self._lent.append((features, busy_s))
                    if new_tokens:
                        self._lent_prefills.append((features, busy_s))
                    if plain:
                        self._lent_plain.append((now, len(ks), busy_s))
            elif settled:
                self._verify.observe(features, busy_s)
                if plain:
                    self._own_plain.append((now, len(ks), busy_s))
            if plain and settled:
                self._judge_lending()

    def observe_data_plane(self, recv_s: float) -> None:
        """A verify call that carried drafts: the seconds the verifier took them off the data
        plane (its report, waiting for drafts still being drafted left out)."""
        if self._reported("the verifier's recv_s", recv_s):
            self._data_plane.append(recv_s)
            self._changes += 1

    def observe_gateway(self, wall_s: float, busy_s: float) -> None:
        if self._reported("a call's busy time", busy_s):
            self._gateway.append(max(0.0, wall_s - busy_s))
            self._changes += 1

    def _reported(self, what: str, seconds: float) -> bool:
        """Whether a time another process reported can be fitted: finite and not negative.
        Anything else is dropped (said once per kind): one NaN in a fit's running sums would
        stay there for good, and every prediction and deadline after it would be NaN."""
        if math.isfinite(seconds) and seconds >= 0.0:
            return True
        if what not in self._refused:
            self._refused.add(what)
            logger.warning("cost model: %s of %r is not a duration; such reports are not fitted", what, seconds)
        return False

    def _track(self, predicted: float, measured: float) -> None:
        if measured > 0 and self.draft_calls + self.verify_calls >= 8:     # past the prior's guess
            self._errors.append(abs(predicted - measured) / measured)

    @property
    def median_error(self) -> float:
        """How far the model's predictions of recent calls were from what they took."""
        return _median(self._errors) if self._errors else 0.0

    @property
    def jitter(self) -> float:
        """The relative standard deviation of a call's busy time around its prediction, read
        from the median error as a normal spread's (median |x| = 0.674 sigma); at most
        MAX_JITTER, so a run of outliers cannot price overlap out altogether."""
        return min(MAX_JITTER, self.median_error / 0.6745)

    def _lent_ratios(self) -> tuple[float, float] | None:
        """(decoding, prefill): lent-core busy time over the own cores' prediction for the
        same call (against today's own-core fit, so an old ratio never rests on an old
        prediction). Decoding's: the median over calls mostly decoding; prefill's: over calls
        mostly prefilling, their decoding part taken out at decoding's ratio: a large prefill uses
        more cores better than a decode step does (one ratio for both priced the lent cores'
        prefill 1.7x too dear), and prompt-heavy calls are few, so they are kept apart."""
        decode = []
        new_weight = self._verify.weights[2]
        for features, busy in self._lent:
            own = self._verify.predict(features)
            if own > 0 and new_weight * features[2] < 0.5 * own:
                decode.append(busy / own)
        if not decode:
            return None
        decode_ratio = _median(decode)
        prefill_s, own_prefill_s = 0.0, 0.0
        for features, busy in self._lent_prefills:
            own = self._verify.predict(features)
            own_prefill = new_weight * features[2]
            spent = busy - decode_ratio * (own - own_prefill)
            if own_prefill >= 0.5 * own > 0 and spent < 2 * decode_ratio * own_prefill:
                prefill_s += spent
                own_prefill_s += own_prefill
        # A ratio of sums, so a wave of prompts outweighs the many single prompts whose share
        # is mostly the decoding part's error; the slow first call after a switch (threads
        # waking) is often a wave, and must not read as a price: calls at over twice
        # decoding's ratio are left out, and prefill is never priced dearer than decoding.
        prefill_ratio = min(decode_ratio, max(0.1, prefill_s / own_prefill_s)) if own_prefill_s else decode_ratio
        return decode_ratio, prefill_ratio

    def costs(self) -> StepCosts:
        """The fitted model's answers, kept until an observation changes them."""
        lapsed = self._slower_lapsed()
        key = (self._changes, self.early_verify, lapsed)
        if self._cached is None or self._cached[0] != key:
            self._cached = key, self._fitted_costs(lapsed)
        return self._cached[1]

    def _fitted_costs(self, slower_lapsed: bool) -> StepCosts:
        per_forward, per_token, fixed, draft_new = self._draft.weights
        verify_fixed, verify_per_token, verify_new, verify_request = self._verify.weights
        borrowed, lent_ratio = (None, None, None, None), None
        ratios = self._lent_ratios()
        judged = self._standing_judgement(slower_lapsed)
        if ratios is not None:
            lent_ratio, prefill_ratio = ratios
            if _lending_pays(judged):
                lent_ratio, prefill_ratio = min(1.0, lent_ratio), min(1.0, prefill_ratio)
            borrowed = (lent_ratio * verify_fixed, lent_ratio * verify_per_token, prefill_ratio * verify_new,
                        lent_ratio * verify_request)
        gateway = _median(self._gateway)
        return StepCosts(per_forward, per_token, fixed, verify_fixed, verify_per_token, gateway, *borrowed[:2],
                         draft_per_new_token=draft_new, verify_per_new_token=verify_new,
                         borrowed_per_new_token=borrowed[2],
                         prompt_per_output=self.prompt_per_output(),
                         verify_per_request=verify_request, borrowed_per_request=borrowed[3],
                         jitter=self.jitter, early_verify=self.early_verify, lent_ratio=lent_ratio,
                         lending_judged=judged, data_plane_per_step=_median(self._data_plane))

    @property
    def lending_pays(self) -> bool:
        """StepCosts.lending_pays of the current costs, without fitting them: the Batch Manager
        asks before every plain step, and a fit after each call took 2% of the gateway's CPU at
        C = 64."""
        return _lending_pays(self._standing_judgement(self._slower_lapsed()))

    def _standing_judgement(self, slower_lapsed: bool) -> float | None:
        """The lending judgement the costs carry: none once one that said slower has lapsed."""
        return None if slower_lapsed else self._lending_judged

    def _slower_lapsed(self) -> bool:
        """Whether the latest judgement said lending slows plain decoding, and was made over
        SLOWER_JUDGED_FOR_S ago."""
        return self._judged_slower() and time.monotonic() - self._lending_judged_at > SLOWER_JUDGED_FOR_S

    def _judged_slower(self) -> bool:
        """Whether the latest judgement said lending slows plain decoding (lapsed or not)."""
        return self._lending_judged is not None and self._lending_judged > 1.0

    @property
    def lending_doubted_at(self) -> float | None:
        """When lending was first read slower than the own cores and not yet confirmed (the
        latest lent call that reading rested on); None when no such reading is pending."""
        return self._lending_doubted_at

    def _judge_lending(self) -> None:
        """Judged after each plain decode call, lent or not (only those change it): the median,
        over recent lent-core plain decode calls, of each one's busy time over the median of
        the own-core plain decode calls of about its batch (within SAME_BATCH) that ran within
        PAIRED_WITHIN_S of it (at least OWN_PARTNERS of them): steps of the same requests on
        either side. Judged afresh once LENT_JUDGED calls have such partners; until then the
        last judgement stands (None: never judged). Own-core plain steps are rare while
        lending pays: the Batch Manager runs a few now and then (BatchManager._lend).
        A judgement is dated by the latest lent call it rests on, so that judging the same
        calls again later (as new lent calls without own-core partners arrive) does not make
        it new (see SLOWER_JUDGED_FOR_S).
        Turning lending off takes two readings in a row: a first one that says slower is only
        a doubt (`lending_doubted_at`; lending goes on), confirmed or cleared by lent calls made
        after it, beside own-core calls near them (the Batch Manager runs a window of them at
        once). One reading rests on a few steps of each side, and whatever slowed the lent
        ones for a moment (another process waking on the lent core) stood for a minute: a
        bench run at C = 1 decoded on one core at ar-1core's pace after such a reading (2.0x)
        in its warm-up, and plain decoding priced on one core can lose the plan to a drafting
        layout. A standing judgement that lending is slower is renewed on one reading."""
        doubt = self._lending_doubted_at
        lent = [call for call in self._lent_plain if doubt is None or call[0] > doubt]
        if len(lent) < LENT_JUDGED:
            return
        # Both windows are in time order (appended as calls return): each lent call's partners
        # are found by bisection, so a judgement costs about (lent calls) x (partners each),
        # not x (own calls kept); it runs after every plain step.
        own = list(self._own_plain)
        times = [t for t, _, _ in own]
        lo = bisect_left(times, lent[0][0] - PAIRED_WITHIN_S)
        hi = bisect_right(times, lent[-1][0] + PAIRED_WITHIN_S, lo)
        if hi - lo < OWN_PARTNERS:
            return      # (after every lent step: while lending pays, no own-core call is near)
        ratios, latest = [], float("-inf")
        for when, batch, busy in lent:
            start = bisect_left(times, when - PAIRED_WITHIN_S, lo, hi)
            end = bisect_right(times, when + PAIRED_WITHIN_S, start, hi)
            partners = [b for _, n, b in own[start:end] if batch / SAME_BATCH <= n <= batch * SAME_BATCH]
            if len(partners) >= OWN_PARTNERS:
                ratios.append(busy / _median(partners))
                latest = max(latest, when)
        if len(ratios) < LENT_JUDGED:
            return
        judged = _median(ratios)
        slower_stands = self._judged_slower() and not self._slower_lapsed()
        if judged > 1.0 and doubt is None and not slower_stands:
            if latest >= time.monotonic() - PAIRED_WITHIN_S:    # (not old calls read again)
                self._lending_doubted_at = latest
                logger.info("lent cores read %.2fx the own cores' plain step time: confirming beside "
                            "own-core steps run now", judged)
            return
        if (judged > 1.0) != slower_stands:
            logger.info("lent cores judged %.2fx the own cores' plain step time: plain decoding %s", judged,
                        "stays on the verifier's own cores" if judged > 1.0 else "borrows them")
        self._lending_doubted_at = None
        self._lending_judged, self._lending_judged_at = judged, latest
