"""Optional evidence for the report: client TTFT samples, server histograms, a profiler trace.

- `samples(path, target_ms)`: p50 / p95 / p99 of client TTFT samples and an exact, distribution-free
  95 % confidence interval for p95 from binomial order statistics, with a verdict against the target.
- `metrics(before, after, ...)`: two Prometheus text scrapes of a vLLM server, histograms diffed
  (after - before = the run), quantiles interpolated within buckets, coarse-bucket warnings.
- `profile(path)`: attention's share of the prefill's kernel time in a torch.profiler Chrome trace
  (attnscope/chrome_trace.py: the same rule and definition as `attnscope share`).

scipy and prometheus_client are imported inside the functions that need them, so a plain report
does not pay for them.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from pathlib import Path

from attnscope import chrome_trace
from attnscope.errors import InputError, finite_real, is_int, short, visible
from attnscope.inputs import load_json, number_text, read_csv, read_text
from attnscope.model.amdahl import MAX_MS

# ------------------------------------------------------------------------------------------ samples

#: Confidence of each one-sided bound used by the verdict, and of the two-sided interval shown.
CONFIDENCE = 0.95
Q95 = 0.95
NEEDED_CAP = 200_000  # the sample-size search stops here


#: Units a sample file can state, as a column / key suffix or with --samples-unit: factor to ms.
UNITS = {"ms": 1.0, "s": 1e3}
#: Known sample columns / keys (a CSV's first row is a header only when it names one of these).
SAMPLE_COLUMNS = {"ttft_ms": "ms", "ttft_s": "s"}
#: Samples whose median is further than this factor from the trace's own TTFT are refused: a unit slip
#: (seconds read as ms is 1000x) would otherwise give a confident wrong verdict.
PLAUSIBLE_FACTOR = 30.0


def _unit_of(found: str | None, unit: str | None, flag: str) -> float:
    """The factor to ms from the file's own unit (`found`) and the --samples-unit flag (`unit`)."""
    if unit is not None and unit not in UNITS:
        raise InputError(f"--samples-unit: expected one of {', '.join(UNITS)}, got {short(unit)}")
    if found and unit and found != unit:
        raise InputError(f"--samples-unit: expected the file's own unit ({found}), got {unit}")
    u = found or unit
    if u is None:
        raise InputError(f"{flag}: expected a unit: a ttft_ms or ttft_s column/key, or --samples-unit ms|s, "
                         "got neither")
    return UNITS[u]


def read_samples(path, unit: str | None = None) -> list[float]:
    """TTFT samples in ms from a JSON list or {"ttft_ms"|"ttft_s": [...]}, a `vllm bench serve` result
    JSON saved with detailed results ({"ttfts": [...]} in seconds), or a CSV (one value per row, or a
    ttft_ms / ttft_s column named in a header row).

    The unit must be stated: by the column or key name, or by `unit` ("ms" or "s", --samples-unit).
    A first CSV row is a header only when it names a known column; "1OO" or "1_000" are errors, and so is a
    row with another cell count than the header (or row 1): `1,234` unquoted is two cells, never 1 ms.
    A vLLM result's failed requests (a non-empty `errors` entry) are left out; its `completed`, when
    present, must count the rest.
    """
    flag = f"--samples {Path(path).name}"
    flag = flag if len(flag) < 80 else "--samples"
    found = None

    def place(i: int) -> str:  # where the i-th value stands in the file, for the messages below
        return f"index {i}"

    if Path(path).suffix.lower() == ".json":
        values = load_json(path, flag)
        if isinstance(values, dict) and "ttfts" in values:
            # a vllm bench serve result, in seconds; failed requests (an `errors` entry; TTFT 0) left out
            ttfts, errors, found = values["ttfts"], values.get("errors"), "s"
            if not isinstance(ttfts, list):
                raise InputError(f"{flag}: expected ttfts to be a list (vllm bench serve result), got "
                                 f"{short(ttfts)}")
            if not (isinstance(errors, list) and len(errors) == len(ttfts)):  # a failed request's TTFT is 0
                got = f"a list of {len(errors)}" if isinstance(errors, list) else short(errors)
                raise InputError(f"{flag}: expected errors to be a list with one entry per ttfts entry "
                                 f"({len(ttfts)}; failed requests are left out by it), got {got}")
            bad = next((i for i, e in enumerate(errors) if not (e is None or isinstance(e, str))), None)
            if bad is not None:
                raise InputError(f"{flag}: expected errors[{bad}] to be a string (empty or null: the request "
                                 f"succeeded), got {short(errors[bad])}")
            # a failed request is one with a non-empty error; a successful one must have a TTFT > 0
            kept = [i for i, e in enumerate(errors) if not e]
            done = values.get("completed", len(kept))  # vLLM's count of successes, by its success flag
            if not is_int(done):
                raise InputError(f"{flag}: expected completed to be a count of requests, got {short(done)}")
            if done != len(kept):  # a failed request with an empty error: its ttft is no sample
                raise InputError(f"{flag}: expected completed ({done}) to equal the requests with an empty "
                                 f"errors entry, got {len(kept)}")
            values = [ttfts[i] for i in kept]

            def place(i: int) -> str:  # the request's own index, failed ones counted
                return f"ttfts[{kept[i]}]"

            zero = next((i for i, t in enumerate(values) if finite_real(t) and t <= 0), None)
            if zero is not None:
                raise InputError(f"{flag}: expected ttfts > 0 for a successful request (empty errors entry), "
                                 f"got {short(values[zero])} at {place(zero)}")
        elif isinstance(values, dict) and len(set(values) & set(SAMPLE_COLUMNS)) == 1:
            key = next(k for k in SAMPLE_COLUMNS if k in values)
            values, found = values[key], SAMPLE_COLUMNS[key]

            def place(i: int) -> str:
                return f"{key}[{i}]"
        if not isinstance(values, list):
            raise InputError(f'{flag}: expected a JSON list of TTFT samples (or {{"ttft_ms": [...]}}, '
                             f'{{"ttft_s": [...]}}, a vllm bench serve result with ttfts), got '
                             f"{type(values).__name__}")
        factor = _unit_of(found, unit, flag)
    else:
        rows = read_csv(path, flag)
        if not rows:
            raise InputError(f"{flag}: expected at least one TTFT sample, got none")
        col = 0
        header = [c.strip().lower() for c in rows[0]]
        named = [h for h in header if h in SAMPLE_COLUMNS]
        if len(named) > 1:
            raise InputError(f"{flag}: expected one TTFT column, got {', '.join(named)}")
        if named:
            col, found = header.index(named[0]), SAMPLE_COLUMNS[named[0]]
            rows = rows[1:]
        elif len(header) > 1:
            raise InputError(f"{flag}: expected one column, or a header with a ttft_ms or ttft_s column, got "
                             f"{short(rows[0])}")
        factor = _unit_of(found, unit, flag)
        values, width = [], len(header)

        def place(i: int) -> str:
            return f"data row {i + 1}"

        for i, r in enumerate(rows):
            if len(r) != width:  # `1,234` is two cells: never read its first as the sample
                raise InputError(f"{flag}: expected {width} cell{'s' * (width > 1)} on data row {i + 1} (as "
                                 f"{'the header' if named else 'row 1'}), got {len(r)}: {short(r)}")
            cell = r[col].strip()
            if not number_text(cell):
                raise InputError(f"{flag}: expected a plain decimal number on data row {i + 1}, "
                                 f"got {short(cell)}")
            if not math.isfinite(v := float(cell)):
                raise InputError(f"{flag}: expected a finite number on data row {i + 1}, got {short(cell)} "
                                 "(past the float range)")
            values.append(v)
    out = []
    for i, v in enumerate(values):
        if not (finite_real(v) and 0 <= v <= 1e9):
            raise InputError(f"{flag}: expected TTFT samples >= 0 (and finite), got {short(v)} at {place(i)}")
        if v == 0:  # -0 too: a request that got a first token took time
            raise InputError(f"{flag}: expected TTFT samples > 0 (a first token takes time), got {short(v)} "
                             f"at {place(i)}")
        out.append(float(v) * factor)
    if not out:
        raise InputError(f"{flag}: expected at least one TTFT sample, got none")
    return out


def _ranks(n, q: float, confidence: float):
    """The 1-based ranks (lower, upper) of `order_stat_ranks` for an int or an array of n, before the
    out-of-range ones (lower < 1, upper > n) are dropped."""
    from scipy.stats import binom

    upper = binom.ppf(confidence, n, q) + 1  # smallest k with P(B <= k) >= confidence, plus one
    k = binom.ppf(1 - confidence, n, q)  # largest k with P(B <= k) <= 1 - confidence
    k = k - (binom.cdf(k, n, q) > 1 - confidence)
    return k + 1, upper


def order_stat_ranks(n: int, q: float = Q95, confidence: float = CONFIDENCE) -> tuple[int | None, int | None]:
    """1-based ranks (lower, upper) of the exact one-sided `confidence` bounds on the q-quantile.

    With B ~ Binomial(n, q) the count of samples below the true quantile x_q (continuous law):
    P(X(u) >= x_q) = P(B <= u - 1) and P(X(l) <= x_q) = P(B >= l). `upper` is the smallest u with
    P(B <= u - 1) >= confidence, None when even u = n is not enough (1 - q**n < confidence: for p95 at
    95 %, fewer than 59 samples). `lower` is the largest l with P(B >= l) >= confidence, None if none.
    """
    lower, upper = (int(x) for x in _ranks(n, q, confidence))
    return (lower if lower >= 1 else None), (upper if upper <= n else None)


def _nearest_rank(xs: list[float], q: float) -> float:
    return xs[max(0, math.ceil(q * len(xs)) - 1)]


def samples_needed(frac_le_target: float, n_now: int, q: float = Q95,
                   confidence: float = CONFIDENCE) -> int | None:
    """Smallest total n > n_now at which the verdict would be decided if the observed distribution held
    (F = frac_le_target, the fraction of samples <= target): accept when F > q and the upper bound's rank
    u(n) <= n * F; reject when F < q and the lower bound's rank l(n) > n * F. None when F = q (the
    observed quantile sits at the target) or not decided below NEEDED_CAP."""
    import numpy as np

    if frac_le_target == q:
        return None
    n = np.arange(n_now + 1, NEEDED_CAP + 1)
    have = n * frac_le_target
    lower, upper = _ranks(n, q, confidence)
    if frac_le_target > q:
        decided = (upper <= n) & (upper <= have + 1e-9)
    else:
        decided = (lower >= 1) & (lower > have + 1e-9)
    idx = np.flatnonzero(decided)
    return int(n[idx[0]]) if idx.size else None


@dataclass(frozen=True)
class SampleStats:
    n: int
    p50: float
    p95: float
    p99: float
    ci_low: float | None  # two-sided exact 95 % interval for p95 (each tail <= 2.5 %)
    ci_high: float | None
    lower_bound: float | None  # one-sided 95 % bounds, used by the verdict
    upper_bound: float | None
    target_ms: float
    frac_le_target: float
    verdict: str  # accept | reject | inconclusive
    needed: int | None
    trace_percentile: float | None  # where the trace's TTFT sits among the samples, %
    warnings: tuple[str, ...] = field(default=())


def samples(path, target_ms: float, trace_ttft_ms: float | None = None,
            unit: str | None = None) -> SampleStats:
    """Summarise client TTFT samples against the p95 target (nearest-rank percentiles).

    unit: "ms" or "s" when the file does not name it (see `read_samples`). With `trace_ttft_ms`, a
    median further than `PLAUSIBLE_FACTOR` from it is refused as a likely unit slip.
    """
    xs = sorted(read_samples(path, unit))
    n = len(xs)
    if trace_ttft_ms is not None and trace_ttft_ms > 0:
        med = _nearest_rank(xs, 0.5)
        if not (trace_ttft_ms / PLAUSIBLE_FACTOR <= med <= trace_ttft_ms * PLAUSIBLE_FACTOR):
            raise InputError(f"--samples: expected TTFTs within {PLAUSIBLE_FACTOR:g}x of the trace's "
                             f"{trace_ttft_ms:g} ms, got a median of {med:.4g} ms (wrong unit? name the "
                             "column ttft_ms or ttft_s, or pass --samples-unit)")
    lo1, up1 = order_stat_ranks(n, Q95, CONFIDENCE)
    lo2, up2 = order_stat_ranks(n, Q95, 1 - (1 - CONFIDENCE) / 2)
    lower = xs[lo1 - 1] if lo1 else None
    upper = xs[up1 - 1] if up1 else None
    frac = sum(x <= target_ms for x in xs) / n
    if upper is not None and upper <= target_ms:
        verdict = "accept"
    elif lower is not None and lower > target_ms:
        verdict = "reject"
    else:
        verdict = "inconclusive"
    needed = None if verdict != "inconclusive" else samples_needed(frac, n)
    warnings = ("Samples under load are correlated (shared batches, queue): the interval, which assumes "
                "independent draws, is optimistic.",)
    if up1 is None:
        warnings += (f"No 95 % upper bound on p95 exists below 59 samples (here {n}): the target cannot be "
                     "accepted.",)
    pct = None if trace_ttft_ms is None else 100.0 * sum(x <= trace_ttft_ms for x in xs) / n
    return SampleStats(n, _nearest_rank(xs, 0.50), _nearest_rank(xs, 0.95), _nearest_rank(xs, 0.99),
                       ci_low=xs[lo2 - 1] if lo2 else None, ci_high=xs[up2 - 1] if up2 else None,
                       lower_bound=lower, upper_bound=upper, target_ms=target_ms, frac_le_target=frac,
                       verdict=verdict, needed=needed, trace_percentile=pct, warnings=warnings)


# ------------------------------------------------------------------------------------------ metrics

#: vLLM histograms read from the scrapes: name -> (label, role). ITL falls back to the older TPOT name.
VLLM_HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": "TTFT (server)",
    "vllm:request_queue_time_seconds": "Queue",
    "vllm:request_prefill_time_seconds": "Prefill",
    "vllm:inter_token_latency_seconds": "Inter-token",
    "vllm:e2e_request_latency_seconds": "End-to-end",
}
ITL_FALLBACK = "vllm:time_per_output_token_seconds"
#: Largest bucket bound and mean observation read, seconds: the trace's own limit (amdahl.MAX_MS).
MAX_S = MAX_MS / 1e3
#: Largest count or sum read: exact in a float (2^53); past it the diffs and ratios lose meaning.
MAX_COUNT = float(2**53)
#: Most lines one scrape may hold (a vLLM server's has a few thousand; each becomes a parsed sample).
MAX_LINES = 200_000


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram in seconds: `bounds[i]` is bucket i's `le` (the last is +inf). `sum` is
    None when the scrape has no `_sum` sample (the mean is then unknown, not 0)."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]  # cumulative
    count: float
    sum: float | None

    def quantile(self, q: float) -> float:
        """Linear interpolation inside the bucket holding rank q * count (Prometheus'
        histogram_quantile); a rank in the +Inf bucket returns the highest finite bound."""
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        prev_bound, prev_count = 0.0, 0.0
        for b, c in zip(self.bounds, self.counts, strict=True):
            if c >= rank:
                if math.isinf(b):
                    return prev_bound
                if c == prev_count:
                    return b
                # the fraction first: (b - prev) * (rank - prev_count) alone can overflow a float
                return prev_bound + (b - prev_bound) * ((rank - prev_count) / (c - prev_count))
            prev_bound, prev_count = b, c
        return prev_bound

    def open_above(self, q: float) -> bool:
        """True when rank q * count falls in the +Inf bucket: `quantile(q)` is then only a lower bound."""
        rank = q * self.count
        return self.count > 0 and (len(self.counts) < 2 or self.counts[-2] < rank)


def _labels_text(key) -> str:
    text = visible(", ".join(f'{k}="{v}"' for k, v in key)) if key else "no labels"
    return text if len(text) <= 60 else text[:57] + "..."


def _series(samples, name: str) -> dict:
    """One histogram's samples by label set (all labels but `le`): {labels: [buckets, count, sum]} with
    buckets keyed by the numeric bound (le="0.25" and le="0.250" are one bound, given twice: refused)."""
    series: dict = {}
    for s in samples:
        if not math.isfinite(s.value) or s.value < 0:
            raise InputError(f"{name}: expected finite counts >= 0, got {short(s.value)} in {s.name}")
        if s.value > MAX_COUNT:
            raise InputError(f"{name}: expected counts and sums of at most {MAX_COUNT:g}, got "
                             f"{short(s.value)} in {s.name}")
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        buckets, _, _ = one = series.setdefault(key, [{}, None, None])
        if s.name.endswith("_bucket"):
            raw = s.labels.get("le")
            if raw is None:
                raise InputError(f"{name}: expected an le label on every _bucket sample, got none")
            finite = raw.strip() not in ("+Inf", "Inf")
            if finite and not (number_text(raw) and 0 <= float(raw) <= MAX_S):
                raise InputError(f"{name}: expected le to be a number in [0, {MAX_S:g}] s or +Inf, got "
                                 f"{short(raw)}")
            le = float(raw) if finite else math.inf
            if le in buckets:
                raise InputError(f"{name}: expected each le bound once per label set, got le={short(raw)} "
                                 f"again (the same bound as {le:g})")
            buckets[le] = s.value
        elif s.name.endswith("_count") or s.name.endswith("_sum"):
            i = 1 if s.name.endswith("_count") else 2
            if one[i] is not None:
                raise InputError(f"{name}: expected one {s.name} per label set, got two")
            one[i] = s.value
    return series


def _histograms(text: str, flag: str) -> dict[str, dict[tuple, Histogram]]:
    """The vLLM histograms of one scrape, one per label set (engines, models): {name: {labels: hist}}.
    Every label set of a histogram must share one set of bucket bounds (they are summed by bound after
    the BEFORE/AFTER diff, which is taken per label set: see `metrics`)."""
    from prometheus_client.parser import text_string_to_metric_families

    lines = text.count("\n") + (not text.endswith("\n"))
    if lines > MAX_LINES:  # the parser builds an object per sample: bounded before it starts
        raise InputError(f"{flag}: expected a scrape of at most {MAX_LINES:,} lines, got {lines:,}")
    out: dict[str, dict[tuple, Histogram]] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError and others on malformed text
        raise InputError(f"{flag}: expected Prometheus text exposition format, got a parse error "
                         f"({short(str(e), 80)})") from None
    # by sample name, not family: without `# TYPE` lines (optional in the format) the parser makes each
    # of _bucket, _count and _sum an untyped family of its own
    by_name: dict[str, list] = {}
    for fam in families:
        for s in fam.samples:
            base, _, suffix = s.name.rpartition("_")
            if suffix in ("bucket", "count", "sum") and (base in VLLM_HISTOGRAMS or base == ITL_FALLBACK):
                by_name.setdefault(base, []).append(s)
    for fam_name, samples in by_name.items():
        name = f"{flag}: {fam_name}"
        series = _series(samples, name)
        bare = next((k for k, v in series.items() if not v[0]), None)
        if bare is not None:  # left out, its requests would vanish from the sum of the label sets
            raise InputError(f"{name}: expected _bucket samples for every label set, got only _count or _sum "
                             f"for {{{_labels_text(bare)}}}")
        bounds_of = {k: tuple(sorted(v[0])) for k, v in series.items()}
        bounds = next(iter(bounds_of.values()))
        odd = next((k for k, b in bounds_of.items() if b != bounds), None)
        if odd is not None:
            raise InputError(f"{name}: expected every label set to have the same bucket bounds (counts are "
                             f"summed by bound), got {len(bounds_of[odd])} bounds in {_labels_text(odd)} "
                             f"and {len(bounds)} in another")
        if math.inf not in bounds:
            raise InputError(f'{name}: expected a le="+Inf" bucket, got none')
        hists = {}
        for key, (buckets, count, total) in series.items():
            one = tuple(buckets[b] for b in bounds)
            for i in range(1, len(bounds)):
                if one[i] < one[i - 1]:
                    raise InputError(f"{name}: expected cumulative bucket counts non-decreasing in le, got "
                                     f"{one[i - 1]:g} at le={bounds[i - 1]:g} then {one[i]:g} at "
                                     f"le={bounds[i]:g}")
            if count is not None and count != one[-1]:
                raise InputError(f"{name}: expected _count equal to the +Inf bucket ({one[-1]:g}), "
                                 f"got {count:g}")
            hists[key] = Histogram(bounds, one, one[-1], total)
        out[fam_name] = hists
    return out


@dataclass(frozen=True)
class HistogramDiff:
    name: str
    label: str
    hist: Histogram
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float | None  # None: no _sum in the scrapes
    target_ms: float | None = None
    meets: str | None = None  # "yes" | "no" | "undecided" (p95 vs target; decidable at bucket edges only)
    warning: str | None = None
    #: the quantiles ("p50", "p95", "p99") whose rank falls in the +Inf bucket: their value is the
    #: highest finite bound, a lower bound on the quantile, not the quantile.
    above: frozenset = frozenset()

    def mark(self, key: str) -> str:
        """"> " before a quantile that is only a lower bound (see `above`), else ""."""
        return "> " if key in self.above else ""


def _diff(name: str, labels, before: Histogram | None, after: Histogram) -> Histogram:
    """AFTER - BEFORE of one label set; a count, sum or bucket that went down is a counter reset."""
    if before is None:
        return after
    where = f"--metrics: {name}{{{_labels_text(labels)}}}"
    if before.bounds != after.bounds:
        raise InputError(f"{where}: expected the same buckets in BEFORE and AFTER, got "
                         f"{len(before.bounds)} and {len(after.bounds)} buckets with different bounds")
    counts = tuple(a - b for a, b in zip(after.counts, before.counts, strict=True))
    went_down = any(c < 0 for c in counts) or after.count < before.count or (
        after.sum is not None and before.sum is not None and after.sum < before.sum)
    if went_down:
        raise InputError(f"{where}: expected AFTER >= BEFORE, got a counter that went down "
                         "(was the server restarted between the scrapes?)")
    total = None if after.sum is None or before.sum is None else after.sum - before.sum
    return Histogram(after.bounds, counts, after.count - before.count, total)


def _check_sum(h: Histogram, where: str) -> None:
    """Refuse a `_sum` the buckets contradict: every observation lies in (lower, upper] of its bucket
    (the first bucket's lower end is 0: latencies), so the sum lies in [sum n_i lower_i, sum n_i upper_i]
    (no upper end when the +Inf bucket holds observations)."""
    if h.sum is None:
        return
    low = high = 0.0
    prev_b, prev_c = 0.0, 0.0
    for b, c in zip(h.bounds, h.counts, strict=True):
        n = c - prev_c
        low += n * prev_b
        high = math.inf if n > 0 and math.isinf(b) else high + (0.0 if math.isinf(b) else n * b)
        prev_b, prev_c = (prev_b if math.isinf(b) else b), c
    slack = 1e-6 * max(low, abs(h.sum)) + 1e-9  # float rounding of the server's running sum and the diff
    if not low - slack <= h.sum <= high + slack:
        hi = "no upper end" if math.isinf(high) else f"{high:.6g} s"
        raise InputError(f"{where}: expected _sum within what the buckets allow ({low:.6g} s to {hi}), "
                         f"got {h.sum:.6g} s")


def _check_target(h: Histogram, target_s: float, q: float = Q95) -> tuple[str, str | None]:
    """Does the q-quantile meet the target? Decidable only at bucket edges: returns (meets, warning)."""
    i = bisect.bisect_left(h.bounds, target_s)  # the bucket (low, high] holding the target
    low, c_low = (h.bounds[i - 1], h.counts[i - 1]) if i else (0.0, 0.0)
    high, c_high = (h.bounds[i], h.counts[i]) if i < len(h.bounds) else (math.inf, h.count)
    if c_low >= q * h.count:
        return "yes", None  # the quantile is at most `low` <= target
    if c_high < q * h.count:
        return "no", None  # the quantile is above `high` >= target
    if target_s == high:
        return "yes", None
    hi = "+Inf" if math.isinf(high) else f"{high * 1e3:g}"
    return "undecided", (
        f"the {target_s * 1e3:g} ms target and the p{round(q * 100)} share the coarse bucket "
        f"({low * 1e3:g}, {hi}] ms, so this histogram cannot accept or reject the target"
    )


def metrics(before_path, after_path, ttft_target_ms: float, tpot_target_ms: float) -> list[HistogramDiff]:
    """Diff the vLLM histograms of two scrapes; p50/p95/p99 in ms; p95 checked against the targets."""
    before = _histograms(read_text(before_path, "--metrics BEFORE"), "--metrics BEFORE")
    after = _histograms(read_text(after_path, "--metrics AFTER"), "--metrics AFTER")
    if "vllm:inter_token_latency_seconds" not in after and ITL_FALLBACK in after:
        after["vllm:inter_token_latency_seconds"] = after.pop(ITL_FALLBACK)
        if ITL_FALLBACK in before:
            before["vllm:inter_token_latency_seconds"] = before.pop(ITL_FALLBACK)
    found = [n for n in VLLM_HISTOGRAMS if n in after]
    for flag, scrape in (("BEFORE", before), ("AFTER", found)):  # an empty BEFORE is not a zero one
        if not scrape:
            raise InputError(f"--metrics {flag}: expected at least one vLLM histogram "
                             f"({', '.join(VLLM_HISTOGRAMS)}), got none")
    targets = {"vllm:time_to_first_token_seconds": ttft_target_ms,
               "vllm:inter_token_latency_seconds": tpot_target_ms}
    out = []
    for name in found:
        got, had = after[name], before.get(name, {})
        gone = next((k for k, h in had.items() if k not in got and h.count > 0), None)
        if gone is not None:
            raise InputError(f"--metrics: {name}{{{_labels_text(gone)}}}: expected AFTER >= BEFORE, got "
                             "the label set missing from AFTER (was the server restarted?)")
        parts = []
        for key, a in got.items():  # per label set first: a reset on one engine must not hide in the sum
            d = _diff(name, key, had.get(key), a)
            _check_sum(d, f"--metrics: {name}{{{_labels_text(key)}}}")
            parts.append(d)
        bounds = parts[0].bounds
        counts = tuple(sum(p.counts[i] for p in parts) for i in range(len(bounds)))
        sums = [p.sum for p in parts]
        total = sum(sums) if all(x is not None for x in sums) else None  # None: the mean is unknown
        big = next((v for v in (total or 0.0, *counts) if not v <= MAX_COUNT), None)
        if big is not None:  # summed over label sets: finite each, but not their sum
            got_text = short(big) if math.isfinite(big) else "a total past the float range"
            raise InputError(f"--metrics: {name}: expected counts and sums of at most {MAX_COUNT:g} over "
                             f"all label sets, got {got_text}")
        h = Histogram(bounds, counts, counts[-1], total)
        if h.count <= 0:
            continue
        if h.sum is not None and h.sum > h.count * MAX_S:  # the mean observation stays printable
            raise InputError(f"--metrics: expected {name}_sum / _count of at most {MAX_S:g} s (the mean "
                             f"observation), got {h.sum / h.count:.4g} s")
        target = targets.get(name)
        meets, warning = (None, None) if target is None else _check_target(h, target / 1e3)
        qs = {"p50": 0.5, "p95": 0.95, "p99": 0.99}
        p50, p95, p99 = (h.quantile(q) * 1e3 for q in qs.values())
        above = frozenset(k for k, q in qs.items() if h.open_above(q))
        mean = None if h.sum is None else h.sum / h.count * 1e3
        out.append(HistogramDiff(name, VLLM_HISTOGRAMS[name], h, p50, p95, p99, mean, target, meets, warning,
                                 above))
    if not out:
        raise InputError("--metrics: expected requests between BEFORE and AFTER, got no new observations")
    return out


# ------------------------------------------------------------------------------------------ profile

def profile(path) -> chrome_trace.Share:
    """Attention's share of the prefill in a torch.profiler Chrome trace (`export_chrome_trace`), by
    `attnscope.chrome_trace.attention_share`: the rule and the definition `attnscope share` uses."""
    where = f"--profile {Path(path).name}"
    return chrome_trace.attention_share(chrome_trace.load(path, where), where)
