"""llama.cpp's exports, as its own code writes them (b11434): on /metrics (``--metrics``) the same four
``spec_decode_*`` counters as vLLM under ``llamacpp:`` (tools/server/server-task.cpp:1565-1623); its logs:
the per-request "draft acceptance = R (A accepted / G generated), mean len = L" (INFO; a slot's stats reset
per task, server-context.cpp:404, :715), "acc per pos = (...)" (trace level), the cumulative "statistics
draft-eagle3: ... #acc rate/pos = (...)" (common/speculative.cpp:3053) and the older "mean acceptance
length = ..., acceptance rate per position = (...)"; and ``/completion`` responses (``timings.draft_n``,
``timings.draft_n_accepted``, server-common.cpp:99-102) with the sampler they ran
(``generation_settings``). docs/metrics.md has the table.
"""

from __future__ import annotations

import re

from ...errors import BadText
from ...investigation.served import Counted, Family, Responses, ServedProfile, numbers, temperature_of
from ...rules.acceptance import Sampler

_REQ = re.compile(
    r"draft acceptance\s*=\s*[\d.]+\s*\(\s*(\d+)\s*accepted\s*/\s*(\d+)\s*generated\)\s*,\s*"
    r"mean len\s*=\s*([\d.]+)"
)
_POS = re.compile(r"acc per pos\s*=\s*\(([\d.,\s]*)\)")
_STATS = re.compile(
    r"statistics\s+(\S+):\s*#calls\(b,g,a\)\s*=\s*\d+\s+\d+\s+(\d+).*?#gen tokens\s*=\s*(\d+)"
    r".*?#acc tokens\s*=\s*(\d+)(?:.*?#acc rate/pos\s*=\s*\(([\d.,\s]*)\))?"
)
_OLD = re.compile(
    r"draft acceptance\s*=\s*[\d.]+\s*\(\s*(\d+)\s*accepted\s*/\s*(\d+)\s*generated\)"
    r".*?mean acceptance length\s*=\s*([\d.]+).*?acceptance rate per position\s*=\s*"
    r"\(([\d.,\s]+)\)"
)


def read_log(text: str, where: str) -> ServedProfile | None:
    stats = list(_STATS.finditer(text))
    if stats:  # cumulative per speculative implementation: the newest holds all
        m = stats[-1]
        calls, gen, acc = int(m[2]), int(m[3]), int(m[4])
        rates = numbers(m[5]) if m[5] else []
        per = tuple(round(r * calls) for r in rates) or None
        return ServedProfile(
            engine="llamacpp",
            source="llamacpp-log",
            where=where,
            drafts=calls,
            accepted_per_position=per,
            accepted=acc,
            draft_tokens=gen,
            num_spec_tokens=len(rates) or None,
            notes=(f"the newest 'statistics {m[1]}' line (running totals since the server started)",),
        )
    old = list(_OLD.finditer(text))
    if old:
        m = old[-1]
        accepted, mean_len = int(m[1]), float(m[3])
        rates = numbers(m[4])
        drafts = round(accepted / (mean_len - 1)) if mean_len > 1 else int(m[2]) // max(len(rates), 1)
        return ServedProfile(
            engine="llamacpp",
            source="llamacpp-log",
            where=where,
            drafts=drafts,
            accepted_per_position=tuple(round(r * drafts) for r in rates),
            accepted=accepted,
            draft_tokens=int(m[2]),
            num_spec_tokens=len(rates) or None,
            notes=(
                "drafts recovered from the logged mean acceptance length (running totals: the last line)",
            ),
        )
    return _per_request(text, where)


def _per_request(text: str, where: str) -> ServedProfile | None:
    """Newer servers log one 'draft acceptance' line per request (a slot's stats reset per request): added
    up, the verify steps recovered from each line's mean length."""
    reqs = list(_REQ.finditer(text))
    if not reqs:
        return None
    drafts = acc_total = gen_total = 0
    per_pos: list[int] = []
    unknown = 0
    for i, m in enumerate(reqs):
        a, g, mean_len = int(m[1]), int(m[2]), float(m[3])
        if mean_len <= 1.0:
            unknown += 1  # 0 accepted: the line gives no verify steps
            continue
        n = round(a / (mean_len - 1))
        drafts += n
        acc_total += a
        gen_total += g
        nxt = reqs[i + 1].start() if i + 1 < len(reqs) else len(text)
        pos = _POS.search(text, m.end(), nxt)
        if pos:
            rates = numbers(pos[1])
            per_pos = [x + round(r * n) for x, r in zip(per_pos + [0] * len(rates), rates)]
    notes = [
        f"{len(reqs)} per-request 'draft acceptance' lines added up (llama.cpp resets a slot's stats per "
        f"request); verify steps recovered from 'mean len' (2 decimals)"
    ]
    if unknown:
        notes.append(
            f"{unknown} request(s) accepted nothing, and their lines give no verify steps: left out, so "
            f"the accept length is an upper bound"
        )
    if per_pos and sum(1 for _ in _POS.finditer(text)) < len(reqs) - unknown:
        per_pos = []
        notes.append("'acc per pos' lines (-lv 4) missing for some requests: per-position counts not used")
    if not drafts:
        return None
    return ServedProfile(
        engine="llamacpp",
        source="llamacpp-log",
        where=where,
        drafts=drafts,
        accepted_per_position=tuple(per_pos) or None,
        accepted=acc_total,
        draft_tokens=gen_total,
        num_spec_tokens=len(per_pos) or None,
        notes=tuple(notes),
    )


def sampler_of(item: dict) -> Sampler | None:
    """The target's sampler a llama.cpp response says it ran (``generation_settings``: top_k, top_p, min_p
    and the ``samplers`` order, the temperature last by default), or None."""
    gs = item.get("generation_settings")
    if not isinstance(gs, dict):
        return None
    k, p, m, order = gs.get("top_k"), gs.get("top_p"), gs.get("min_p"), gs.get("samplers")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (k, p, m)):
        return None
    first = (isinstance(order, list) and "temperature" in order
             and all(order.index(f) < order.index("temperature") for f in ("top_k", "top_p", "min_p")
                     if f in order))
    return Sampler(max(0, int(k)), round(float(p), 6), round(float(m), 6), bool(first))


def read_response(it: dict, where: str, i: int) -> Counted | None:
    """One /completion response's drafted and accepted tokens (no verify steps), and its sampler."""
    timings = it.get("timings")
    if not (isinstance(timings, dict) and "draft_n" in timings):
        return None
    dn, da = timings.get("draft_n"), timings.get("draft_n_accepted", 0)
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (dn, da)) or da > dn:
        raise BadText(
            f"{where}: item {i}'s timings draft_n {dn!r}, draft_n_accepted {da!r}; expected "
            f"counts with accepted <= drafted"
        )
    return Counted(None, da, dn, sampler_of(it))


def from_responses(r: Responses) -> ServedProfile:
    """Totals only: verify steps follow from the draft length the user gives (--draft-tokens K)."""
    k = r.num_spec_tokens
    rounds = round(r.drafted / k) if k else None
    notes = [f"{r.counted} of {r.items} responses carried timings.draft_n"]
    if rounds is None:
        notes.append(
            "llama.cpp's timings give drafted and accepted tokens but not the verify steps: pass "
            "--draft-tokens K (its --spec-draft-n-max) for an accept length; without it none is judged"
        )
    else:
        notes.append(
            f"verify steps taken as draft_n / {k}: a lower bound (a round drafts at most {k}, fewer "
            f"near the end of a request), so the accept length from it is an upper bound: a shortfall "
            f"it shows is real, an ok may not be"
        )
    return ServedProfile(
        engine="llamacpp",
        source="llamacpp-responses",
        where=r.where,
        drafts=rounds,
        accepted_per_position=None,
        accepted=r.accepted,
        draft_tokens=r.drafted,
        num_spec_tokens=k,
        temperature=r.temperature,
        temperature_source=r.temperature_source,
        notes=tuple(notes),
        sampler=r.sampler,
    )


def read_document(obj, where: str) -> None:
    """``/slots`` says each slot's last sampling but no speculative counts: said, with what would."""
    items = obj if isinstance(obj, list) else [obj]
    slots = all(isinstance(it, dict) and "id_task" in it and "params" in it for it in items)
    if not (items and slots):
        return None
    if any(isinstance(it.get("timings"), dict) and "draft_n" in it["timings"] for it in items):
        return None
    t = temperature_of({"request": items[0]["params"]})
    raise BadText(
        f"{where}: llama.cpp's /slots: each slot's last request's sampling (temperature "
        f"{'unknown' if t is None else f'{t:g}'}), no speculative counts; pass its /metrics "
        f"(llama-server --metrics) or the /completion responses, with --temperature for the traffic's"
    )


FAMILY = Family(
    "llamacpp",
    "llamacpp:",
    per_position=True,
    per_position_hint="llama.cpp's /metrics with --metrics "
    "(llamacpp:spec_decode_num_accepted_tokens_per_pos_total)",
    responses_expected="llama.cpp /completion responses (timings.draft_n)",
    read_log=read_log,
    read_response=read_response,
    from_responses=from_responses,
    read_document=read_document,
    counters=lambda name: name.startswith("llamacpp:spec_decode_num"),
)
