"""profile-moe's one-launch step (moe_sweep._one_launch) with a fake family and fake timings (CPU):
the one-launch pairs are timed as the layer, checked against the staged reference, and win both
stage entries only when faster than the two stage winners added."""
import torch

from mixed_gemm.kernels import MoeProblem
from mixed_gemm.kernels.moe_gemv import FAMILY
from mixed_gemm.profiler import moe_sweep


class _Launcher:
    def __init__(self, config, wrong):
        self.config, self.wrong = config, wrong

    def launch_layer(self, down, x, w13, w2, ids, weights, h, y, tokens, top_k, stream):
        y.copy_(_REF + (1.0 if self.wrong else 0.0))


_REF = torch.linspace(-1, 1, 2 * 64).view(2, 64).half()


class _Family:
    name = "moe_gemv"

    def __init__(self, pairs, wrong=()):
        self.pairs, self.wrong = pairs, wrong

    def supports(self, dev):
        return True, ""

    def layer_candidates(self, problems, sms):
        return self.pairs

    def from_schedule(self, schedule, **kind):
        return FAMILY.from_schedule(schedule, **kind)

    def can_implement(self, config, problem):
        return FAMILY.can_implement(config, problem)

    def plan_rules(self, configs):
        return FAMILY.plan_rules(configs)

    def launcher(self, config, dev):
        return _Launcher(config, config.schedule in self.wrong)


def _problems():
    kw = dict(tokens=1, top_k=2, experts=16, dtype="f16", bits=4, zero_mode="int", group_size=128, layout="sm90a")
    return (MoeProblem(n=256, k=64, stage="w13", gate_up=True, **kw), MoeProblem(n=64, k=128, stage="w2", **kw))


def _run(monkeypatch, fam, secs, staged):
    monkeypatch.setattr(moe_sweep, "GROUPED_FAMILIES", (fam,))
    monkeypatch.setattr(moe_sweep, "current_stream", lambda dev: 0)
    timed = iter(secs)
    monkeypatch.setattr(moe_sweep, "time_graph", lambda fn, warm, reps: (fn(0), next(timed))[1])
    winners = [dict(stage="w13", schedule="moe_gemv:w13_s1_w4x2_u8", us=staged[0] * 1e6),
               dict(stage="w2", schedule="moe_gemv:w2_s1_w4x2_u8", us=staged[1] * 1e6)]
    stage_best = {"w13": (0, staged[0]), "w2": (1, staged[1])}
    x, h = torch.zeros(1, 64), torch.zeros(2, 128)
    logs = []
    moe_sweep._one_launch(winners, stage_best, _problems(), x, None, None, None, None, h, _REF.clone(), 1, 2, 0, 132,
                          3, "test", logs.append)
    return winners, logs


PAIRS = [("w13_s1_w4x2_u8_m8_pe1", "w2_s1_w4x2_u8_m8_pe1"),
         ("w13_s1_w4x2_u8_m8_pe1_split2", "w2_s1_w4x2_u8_m8_pe1"),
         ("w13_s1_w4x2_u8_m8_pe1", "w2_s1_w4x2_u8_m16_pe")]  # not a pair: never timed


def test_one_launch_wins_both_entries_when_faster(monkeypatch):
    winners, logs = _run(monkeypatch, _Family(PAIRS), [9e-6, 7e-6], (6e-6, 4e-6))
    assert [w["schedule"] for w in winners] == ["moe_gemv:w13_s1_w4x2_u8_m8_pe1_split2", "moe_gemv:w2_s1_w4x2_u8_m8_pe1"]
    assert [w["us"] for w in winners] == [3.5, 3.5] and "(2 timed)" in logs[-1]


def test_staged_winners_stay_when_faster_and_wrong_outputs_are_skipped(monkeypatch):
    winners, _ = _run(monkeypatch, _Family(PAIRS), [12e-6, 11e-6], (6e-6, 4e-6))
    assert [w["schedule"] for w in winners] == ["moe_gemv:w13_s1_w4x2_u8", "moe_gemv:w2_s1_w4x2_u8"]
    fam = _Family(PAIRS, wrong={"w13_s1_w4x2_u8_m8_pe1_split2"})
    winners, logs = _run(monkeypatch, fam, [9e-6], (6e-6, 4e-6))
    assert any("differs from the staged reference" in line for line in logs)
    assert winners[0]["schedule"] == "moe_gemv:w13_s1_w4x2_u8_m8_pe1" and winners[1]["us"] == 4.5
