"""One Session used from several threads gives what a serial run gives (captures take turns)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import castcore


def test_four_threads_on_one_session_match_a_serial_run(session, tiny_llama):
    workloads = [
        castcore.build_workload(str(tiny_llama), seq=seq, phase=phase)
        for seq in (8, 16)
        for phase in ("prefill", "decode")
    ]
    serial = [session.estimate(w).to_dict() for w in workloads]
    with ThreadPoolExecutor(max_workers=4) as pool:
        threaded = list(pool.map(lambda w: session.estimate(w).to_dict(), workloads * 2))
    for got, want in zip(threaded, serial * 2):
        assert got["totals"] == want["totals"]
        assert got["ops"] == want["ops"] and got["modules"] == want["modules"]
