"""What a kernel package for an arch holds (select/coverage.py), without a GPU."""
from mixed_gemm.select import coverage

# The shapes the H200 profile measures itself (70B shards at TP 2), and one it leaves to the H100's.
SHAPES = ((5120, 8192), (8192, 4096), (28672, 8192), (8192, 8192))
MS = (1, 16)


def names(found):
    return {c.kernel_name for _, c in found}


def test_a_package_holds_what_every_shipped_profile_of_the_arch_picks():
    """The sm90a package serves the H100 and the H200: the H200's own entries replace the H100's
    on a few shapes, and the package holds those picks too (else an H200 runs stand-ins there,
    for good where no nvcc is installed)."""
    profiles = coverage.shipped_profiles((9, 0))
    assert {p.path.name for p in profiles} >= {"h100.json", "h200.json"}
    assert coverage.shipped_profile((9, 0)).path.name == "h100.json"
    packaged = names(coverage.selectable("sm90a", shapes=SHAPES, m_buckets=MS))
    picks = {p.path.name: names(coverage.selectable_for((9, 0), 132, p, SHAPES, MS)) for p in profiles}
    assert all(found <= packaged for found in picks.values())
    assert picks["h200.json"] - picks["h100.json"], "the H200 picks nothing of its own here: the test proves nothing"


def test_a_sm90a_package_holds_the_sm90s_catalog_and_an_sm80_one_does_not():
    """sm90s's heuristic is off by default, so selection alone never picks it: the package ships
    its catalog (Family.packaged) for the switch and for profiles that name it."""
    from mixed_gemm.kernels import family

    catalog = {c.kernel_name for c in family("sm90s").catalog() if not (c.half_issue or c.in_flight)}
    packaged = names(coverage.selectable("sm90a", shapes=SHAPES[:1], m_buckets=(16,)))
    assert catalog <= packaged
    assert not catalog & names(coverage.selectable("sm80", shapes=SHAPES[:1], m_buckets=(16,)))
    # Half issue and in-flight kernels (profile candidates, unmeasured) come in only through a
    # profile naming them.
    half = {c.kernel_name for c in family("sm90s").catalog() if c.half_issue or c.in_flight}
    assert half and not half & packaged


def test_shipped_entries_run_on_a_default_weight_but_the_known_sm80_ones():
    """Every entry of the shipped Hopper profiles is what selection runs for a weight packed the
    default way (sm90a), except the H100's legacy sm80-layout decode entries on shapes outside the
    Llama-3 fused layers (M <= 8: selection borrows the nearest shape's gemv entry there). A new entry
    that a default weight cannot run fails here: ship entries measured on the layout users hold."""
    for profile in coverage.shipped_profiles((9, 0)):
        for entry, runs, source in coverage.passed_over(profile, (9, 0), 132):
            where = f"{profile.path.name}: {entry} -> {runs} ({source})"
            assert entry["schedule"].startswith("sm80:") and "_sm90a" not in entry["schedule"], where
            assert entry["m"] <= 8 and entry["dtype"] == "f16" and entry["bits"] == 4, where
            assert profile.path.name == "h100.json", where
