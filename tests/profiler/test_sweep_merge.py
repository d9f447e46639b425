"""The dense sweep's merge (sweep.merge_winners, CPU): --keep-faster keeps an entry recorded faster
than the new winner only where this sweep did not time that entry's schedule itself."""
from mixed_gemm.profiler.sweep import _row_id, merge_winners
from mixed_gemm.select.profiles import Profile, entry_key

KEY = dict(dtype="bf16", bits=4, zero_mode="int", group_size=128, n=4096, k=4096, m=1)
OLD = "gemv:m8_s1_w1x8_u16_ds"
NEW = "gemv:m8_s1_w2x8_u8_ds"
ENTRY = entry_key(KEY)


def _profile():
    p = Profile()
    p.add(dict(KEY, schedule=OLD, us=6.744))  # recorded on another run
    return p


def _done(*rows):
    return {_row_id(dict(KEY, schedule=s)): dict(KEY, schedule=s, us=us) for s, us in rows}


def test_keep_faster_keeps_an_entry_this_sweep_did_not_time():
    p = _profile()
    kept = merge_winners(p, [dict(KEY, schedule=NEW, us=7.047)], _done((NEW, 7.047)), keep_faster=True)
    assert kept == 1 and p.entry(ENTRY, 1)["schedule"] == OLD


def test_keep_faster_replaces_an_entry_the_sweep_timed_slower():
    # --against-profile timed the old schedule in this run (8.25 µs): the recorded 6.744 does not count.
    p = _profile()
    kept = merge_winners(p, [dict(KEY, schedule=NEW, us=7.047)], _done((NEW, 7.047), (OLD, 8.25)), keep_faster=True)
    assert kept == 0 and p.entry(ENTRY, 1)["schedule"] == NEW


def test_without_keep_faster_the_winner_replaces():
    p = _profile()
    assert merge_winners(p, [dict(KEY, schedule=NEW, us=7.047)], {}, keep_faster=False) == 0
    assert p.entry(ENTRY, 1) == dict(KEY, schedule=NEW, us=7.047)

