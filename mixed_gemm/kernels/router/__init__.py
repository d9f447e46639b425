"""The ``router`` family: a mixture-of-experts router (logits, softmax, top-k, renormalization)
in one launch (templates/router/router.cuh). Not a GEMM family: it follows the family contract (a
frozen config, its template, arch flags, ``can_implement`` with reasons, a launcher on torch's
current stream) but is not in the GEMM registry (``kernels.FAMILIES``); routers reach it through
:mod:`mixed_gemm.ops.router`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

from ...codegen import render_template
from ...runtime import get_module
from ..base import OK, SM80_UP_FLAGS, Family, Verdict
from .abi import ROUTER_ARGS_BYTES, RouterArgs
from .config import (COUNTERS, ELEMENTS, MAX_EXPERTS, MAX_STAGED, MAX_TOKENS, MAX_TOP_K, SPLITS, TOKENS, TORCH_DTYPES,
                     VECTOR, RouterConfig, catalog, choose, constant_checks, one_token, tiled)


@dataclass(frozen=True)
class RouterProblem:
    """One call as the kernel sees it: ``tokens`` rows of ``hidden`` activations routed over
    ``experts`` experts, ``top_k`` each; element names of x, the weight, logits and scores."""

    tokens: int
    experts: int
    hidden: int
    top_k: int
    x: str
    w: str
    logits: str
    scores: str


class RouterFamily(Family):
    name = "router"
    config_class = RouterConfig
    sets_layout = False
    # 16-byte loads, bf16 conversions, __ldcg: sm_80 and later (PTX for newer GPUs).
    arch_flags = SM80_UP_FLAGS
    min_capability = (8, 0)

    def can_implement(self, config: RouterConfig, problem: RouterProblem) -> Verdict:
        if not isinstance(problem, RouterProblem):
            return False, f"{self.name} routes tokens (a RouterProblem), not {type(problem).__name__}"
        kinds = (config.x, config.w, config.logits, config.scores)
        if kinds != (problem.x, problem.w, problem.logits, problem.scores):
            return False, f"{config.name} is for x/w/logits/scores {'/'.join(kinds)}"
        reasons = [why for ok, why in (
            (1 <= problem.experts <= MAX_EXPERTS, f"experts must lie in [1, {MAX_EXPERTS}], got {problem.experts}"),
            (1 <= problem.top_k <= min(MAX_TOP_K, problem.experts),
             f"top_k must lie in [1, min({MAX_TOP_K}, experts)], got {problem.top_k}"),
            (problem.hidden > 0 and problem.hidden % VECTOR == 0,
             f"hidden must be a positive multiple of {VECTOR} (16-byte loads), got {problem.hidden}"),
            (1 <= problem.tokens <= MAX_TOKENS, f"tokens must lie in [1, {MAX_TOKENS}], got {problem.tokens}"),
            (config.staged_bytes(problem.hidden) <= MAX_STAGED,
             f"a {config.tokens}-token tile stages {config.staged_bytes(problem.hidden)} bytes of x, more than "
             f"{MAX_STAGED} (hidden {problem.hidden})"),
        ) if not ok]
        return (False, "; ".join(reasons)) if reasons else OK

    def catalog(self) -> List[RouterConfig]:
        return catalog()

    def render(self, config: RouterConfig) -> str:
        return render_template("router/router.cu.j2", family=self.name, config=repr(config), name=config.kernel_name,
                               x=ELEMENTS[config.x][0], w=ELEMENTS[config.w][0], logits=ELEMENTS[config.logits][0],
                               scores=ELEMENTS[config.scores][0], warps=config.warps, split=config.split,
                               tokens=config.tokens, threads=config.threads, args_bytes=ROUTER_ARGS_BYTES,
                               constants=constant_checks())

    def launcher(self, config: RouterConfig, device_index: int) -> "RouterLauncher":
        return RouterLauncher(config, get_module(self.build_spec(config), device_index))


class RouterLauncher:
    """One loaded router kernel with its argument block: fill the fields and :meth:`launch` while
    holding ``fn.lock``."""

    def __init__(self, config: RouterConfig, module):
        self.config = config
        # A multi-token tile opts in to MAX_STAGED bytes of dynamic shared memory; each launch asks
        # for its hidden size's share.
        self.fn = module.function(config.kernel_name, RouterArgs, config.threads,
                                  MAX_STAGED if config.tokens > 1 else 0)
        self.args = self.fn.args

    def launch(self, tokens: int, experts: int, hidden: int, stream: int) -> None:
        self.fn.launch(self.config.grid(tokens, experts), stream, smem=self.config.staged_bytes(hidden))


FAMILY = RouterFamily()

__all__ = ["COUNTERS", "ELEMENTS", "FAMILY", "MAX_EXPERTS", "MAX_STAGED", "MAX_TOKENS", "MAX_TOP_K", "SPLITS", "TOKENS",
           "TORCH_DTYPES", "VECTOR",
           "RouterArgs", "RouterConfig", "RouterFamily", "RouterLauncher", "RouterProblem", "catalog", "choose",
           "one_token", "tiled"]
