"""The history's pages (ResultLog.recent, GET /history): every key's results merged newest first, filtered, paged."""

from __future__ import annotations

import random

from smoosh.daemon.results import Result, ResultLog


def test_results_of_many_keys_interleave_newest_first_and_every_page_is_that_list_s_slice() -> None:
    # Given results of forty keys, finished in a shuffled order, at most five kept per key
    rng = random.Random(7)
    log = ResultLog("n", max_per_key=5, max_keys=30)
    ends = list(range(400))
    rng.shuffle(ends)
    for at in sorted(ends):
        key = f"/srv/dbs/{rng.randrange(40)}.db"
        log.write_for(key, Result(float(at), "ratio_dbs" if at % 3 else "slack_dbs", rng.choice(["ok", "busy", "failed"]),
                                  1.0, 100, 40))
    held = [(key, r, i == 0) for key, rs in log.rows().items() for i, r in enumerate(rs)]
    expected = sorted(held, key=lambda item: item[1].at, reverse=True)
    # Then the whole list is every result held, newest first, each key's newest marked
    page, total = log.recent(limit=10_000)
    assert total == len(held) and [(k, r.at, latest) for k, r, latest in page] == [(k, r.at, latest) for k, r, latest in expected]
    # And each page, filter and channel is the matching slice of it
    for results, channel in ((None, None), (frozenset({"failed"}), None), (frozenset({"ok", "busy"}), "slack_dbs")):
        matching = [item for item in expected
                    if (results is None or item[1].result in results) and (channel is None or item[1].channel == channel)]
        for offset in (0, 7, len(matching) - 1, len(matching) + 3):
            page, total = log.recent(results=results, channel=channel, offset=offset, limit=7)
            assert total == len(matching)
            assert [(k, r.at) for k, r, _ in page] == [(k, r.at) for k, r, _ in matching[offset:offset + 7]]
