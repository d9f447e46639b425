"""profile-moe's layer check (moe_sweep._layer_check, choose_pair) with fake plans and fake timings
(CPU): every pair is checked once against the staged reference and timed under every routing, the
totals over the routings decide, and the stage winners stay unless beaten by the margin."""
import contextlib

import pytest
import torch

from mixed_gemm.profiler import moe_sweep

W13 = {"a:1": 3.0, "a:2": 1.0}
W2 = {"a:9": 2.0, "a:8": 1.0}
STAGED = ("a:2", "a:8")  # the stage winners (the fastest of each stage)
OTHER = ("a:1", "a:9")


def test_choose_pair_sums_the_routings():
    # Level under routing 0, 11% slower under routing 1: the other pair's total wins.
    timed = {(STAGED, 0): 93.2, (STAGED, 1): 104.4, (OTHER, 0): 92.6, (OTHER, 1): 94.0}
    best, totals = moe_sweep.choose_pair(timed, STAGED, 2)
    assert best == OTHER and totals == {STAGED: pytest.approx(197.6), OTHER: pytest.approx(186.6)}
    # One routing alone (the sweep's before): within the margin, the stage winners stay.
    assert moe_sweep.choose_pair(timed, STAGED, 1)[0] == STAGED


def test_choose_pair_drops_pairs_missing_a_routing_and_keeps_untimed_winners():
    timed = {(STAGED, 0): 10.0, (STAGED, 1): 10.0, (OTHER, 0): 1.0}
    best, totals = moe_sweep.choose_pair(timed, STAGED, 2)
    assert best == STAGED and list(totals) == [STAGED]
    assert moe_sweep.choose_pair({(OTHER, 0): 1.0}, STAGED, 1)[0] == STAGED


class _Plan:
    def __init__(self, pair):
        self.configs = pair


def _run(monkeypatch, seconds, wrong=(), incumbent=None, runoff=None, rounds=None):
    """_layer_check over two routings; ``seconds[(pair, routing)]`` is what the fake timer returns
    (``runoff``: what it returns from its second call on, the runoff's; ``rounds``: each call's
    replays are appended to it). Returns the first call's keys as ``timed``."""
    forced = []

    @contextlib.contextmanager
    def forced_schedules(*pair):
        forced.append(pair)
        yield

    ref = torch.linspace(-1, 1, 8).view(2, 4)
    calls = []

    def moe_grouped(x, w13, w2, weights, ids, configs):
        calls.append((configs, int(ids[0, 0])))
        return ref + (1.0 if configs in wrong else 0.0)

    timed_keys, calls_made = [], []

    def cold_s(fns, replays, eager=True):
        if not calls_made:
            timed_keys.extend(fns)
        calls_made.append(list(fns))
        if rounds is not None:
            rounds.append((replays, sorted({pair for pair, _ in fns})))
        for fn in fns.values():
            fn()
        table = seconds if len(calls_made) == 1 or runoff is None else runoff
        return {key: (table[key], "graph") for key in fns}

    monkeypatch.setattr(moe_sweep, "forced_schedules", forced_schedules)
    monkeypatch.setattr(moe_sweep, "grouped_plan", lambda x, w13, w2, top_k: _Plan(forced[-1]))
    monkeypatch.setattr(moe_sweep, "moe_grouped", moe_grouped)
    monkeypatch.setattr(moe_sweep, "time_cold", cold_s)
    winners = [dict(stage="w13", schedule=STAGED[0], us=1.0), dict(stage="w2", schedule=STAGED[1], us=1.0)]
    routings = [(torch.full((2, 2), r), torch.ones(2, 2)) for r in (5, 6)]
    logs = []
    moe_sweep._layer_check(winners, {"w13": (0, 1e-6), "w2": (1, 1e-6)}, {"w13": W13, "w2": W2},
                           {"w13": OTHER[0], "w2": OTHER[1]}, None, None, None, routings, ref.clone(), 2, 3,
                           "test", logs.append, incumbent=incumbent)
    return winners, logs, calls, timed_keys


def test_layer_check_times_every_routing_and_takes_the_best_total(monkeypatch):
    seconds = {(STAGED, 0): 93.2e-6, (STAGED, 1): 104.4e-6, (OTHER, 0): 92.6e-6, (OTHER, 1): 94.0e-6}
    for a in W13:
        for b in W2:
            for r in (0, 1):
                seconds.setdefault(((a, b), r), 200e-6)
    winners, logs, calls, timed = _run(monkeypatch, seconds)
    assert {r for _, r in timed} == {0, 1} and len(timed) == 2 * len({p for p, _ in timed})
    assert [w["schedule"] for w in winners] == list(OTHER)
    assert [w["us"] for w in winners] == [3e6, 2e6]  # each entry keeps its own stage time
    assert "92.6 / 94.0" in logs[-1] and "93.2 / 104.4" in logs[-1] and logs[-1].endswith("taken")
    assert {ids for configs, ids in calls[: len({p for p, _ in timed})]} == {5}  # checked on the sweep's routing


def test_layer_check_decides_by_a_runoff_of_the_best_two_and_the_pair_to_beat(monkeypatch):
    # The first timing ranks OTHER 5% ahead; the runoff (the two best and the stage winners, three
    # times the replays) reads them level, so the stage winners stay.
    seconds = {((a, b), r): 200e-6 for a in W13 for b in W2 for r in (0, 1)}
    seconds.update({(STAGED, 0): 100e-6, (STAGED, 1): 100e-6, (OTHER, 0): 95e-6, (OTHER, 1): 95e-6,
                    (("a:1", "a:8"), 0): 99e-6, (("a:1", "a:8"), 1): 99e-6})
    runoff = dict(seconds)
    runoff.update({(OTHER, 0): 100e-6, (OTHER, 1): 99.8e-6, (("a:1", "a:8"), 0): 99.5e-6, (("a:1", "a:8"), 1): 99.5e-6})
    rounds = []
    winners, logs, _, _ = _run(monkeypatch, seconds, runoff=runoff, rounds=rounds)
    assert [r for r, _ in rounds] == [3, 3 * moe_sweep.RUNOFF_REPLAYS]
    assert rounds[1][1] == sorted([STAGED, OTHER, ("a:1", "a:8")])
    assert [w["schedule"] for w in winners] == list(STAGED)
    assert any("runoff" in line and "190.0 -> 199.8" in line for line in logs)
    # Where the runoff agrees with the first timing, OTHER is taken.
    winners, logs, _, _ = _run(monkeypatch, seconds, runoff=seconds)
    assert [w["schedule"] for w in winners] == list(OTHER) and logs[-1].endswith("taken")


def test_layer_check_skips_wrong_pairs_and_keeps_winners_within_the_margin(monkeypatch):
    seconds = {}
    for a in W13:
        for b in W2:
            for r in (0, 1):
                seconds[((a, b), r)] = 100e-6
    seconds[(OTHER, 0)] = 99.5e-6  # 0.25% faster in total: inside the margin
    winners, logs, _, timed = _run(monkeypatch, seconds, wrong={("a:2", "a:9")})
    assert ("a:2", "a:9") not in {p for p, _ in timed}
    assert any("output differs from the staged reference" in line for line in logs)
    assert [w["schedule"] for w in winners] == list(STAGED) and not logs[-1].endswith("taken")


INCUMBENT = ("b:5", "b:6")  # the profile's pair, neither schedule timed as a stage


def _seconds(staged, incumbent, rest=200e-6):
    out = {((a, b), r): rest for a in W13 for b in W2 for r in (0, 1)}
    for r in (0, 1):
        out[(STAGED, r)], out[(INCUMBENT, r)] = staged, incumbent
    return out


@pytest.mark.parametrize("staged,incumbent,kept", [
    (100e-6, 99.5e-6, True),    # the stage winners are slower as the layer: the incumbent stays
    (99.5e-6, 100e-6, True),    # 0.5% faster: inside the margin, the incumbent stays
    (95e-6, 100e-6, False),     # 5% faster: the stage winners replace it
])
def test_layer_check_holds_the_current_pair_to_the_margin(monkeypatch, staged, incumbent, kept):
    winners, logs, _, timed = _run(monkeypatch, _seconds(staged, incumbent), incumbent=INCUMBENT)
    assert {(INCUMBENT, 0), (INCUMBENT, 1)} <= set(timed)
    if kept:
        # Neither schedule was timed as a stage: each entry records half the pair's layer time.
        assert [w["schedule"] for w in winners] == list(INCUMBENT)
        assert [w["us"] for w in winners] == [pytest.approx(incumbent / 2 * 1e6)] * 2
        assert "current" in logs[-1] and logs[-1].endswith("current kept")
    else:
        assert [w["schedule"] for w in winners] == list(STAGED) and not logs[-1].endswith("taken")


def test_layer_check_falls_back_to_the_stage_winners_when_the_current_pair_is_wrong(monkeypatch):
    winners, logs, _, _ = _run(monkeypatch, _seconds(100e-6, 50e-6), wrong={INCUMBENT}, incumbent=INCUMBENT)
    assert [w["schedule"] for w in winners] == list(STAGED)


class _Profile:
    def __init__(self, entries):
        self.entries = entries

    def lookup_grouped(self, problem):
        return self.entries.get(problem)


def test_current_pair_needs_both_stages():
    problems = {"w13": "p13", "w2": "p2"}
    assert moe_sweep.current_pair(None, problems) is None
    assert moe_sweep.current_pair(_Profile({"p13": (1, "a:1")}), problems) is None
    assert moe_sweep.current_pair(_Profile({"p13": (1, "a:1"), "p2": (2, "b:2")}), problems) == ("a:1", "b:2")
