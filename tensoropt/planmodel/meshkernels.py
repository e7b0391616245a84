"""The compiled kernels of :mod:`.meshplan`'s evaluator: the memory walk and the simulator of a plan
whose every operator runs on one mesh, over the evaluator's tables.

:class:`~.meshplan.MeshEvaluator` reads every cost once per (graph, mesh) into arrays indexed by
configuration (:func:`~.meshplan._build_tables`); a plan is a vector of configuration indices, and
these kernels evaluate it: :func:`_walk` (the per-device peak, :func:`~.walk.walk`'s live-set walk
on integer storage keys) and :func:`_simulate` (the step time, :meth:`~.simulate._Schedule.run`'s
event loop on the simulator's tasks), each of one plan, and :func:`_walk_many` /
:func:`_simulate_many` of the rows of a matrix of plans.

They live apart from the evaluator so that they import nothing but NumPy and numba: a package
install compiles them (``setup.py``: :func:`tensoropt._kernels.build`) without torch, from the
tables of a tiny evaluator saved beside this file (``tiny_tables.npz``, written by
:func:`~.meshplan.write_tiny_tables`; ``tests/test_kernels.py`` checks that its argument types are
the evaluator's).

Owns: the kernels' arithmetic.  Must not: build tables, or state a cost rule of its own (the rules
are the plan model's; ``tests/planmodel/test_meshplan.py`` holds the kernels equal to
:func:`~.simulate.simulate` on random plans of real graphs).

Example (the tiny evaluator's tables, two plans)::

    >>> import numpy as np
    >>> tables = tiny_tables()
    >>> n = len(tables["walk"][0])               # one entry per operator
    >>> vecs = np.zeros((2, n), dtype=np.int64)   # both plans: every operator in configuration 0
    >>> peaks = _walk_many(vecs, *tables["walk"])
    >>> bool(peaks[0] == peaks[1] == _walk(vecs[0], *tables["walk"])[0])
    True
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .. import _kernels as kernels
from .._kernels import compiled

#: the tables of :func:`~.meshplan._tiny_evaluator` (``{"walk": (...), "time": (...)}``, each entry an
#: array or a Python scalar), saved by :func:`~.meshplan.write_tiny_tables`
TINY_TABLES = Path(__file__).with_name("tiny_tables.npz")


# ---- shared: which parameters' gradients are summed across the mesh --------------------------


@compiled
def _levels(a, q_read_ptr, q_readers, q_train, cut, shard, k):  # pragma: no cover - compiled
    """Trainable parameter → the sharding level that keeps it in pieces, 0 where none
    (:func:`tensoropt.plan.sharded_parameters` on one mesh: every reader has the same level ≥ 1
    and reads it whole, on k ≥ 2 devices)."""
    nq = q_train.shape[0]
    lvl = np.zeros(nq, dtype=np.int64)
    if k < 2:
        return lvl
    for q in range(nq):
        if not q_train[q] or q_read_ptr[q] == q_read_ptr[q + 1]:
            continue
        r0 = q_readers[q_read_ptr[q]]
        level = shard[r0, a[r0]]
        for r in range(q_read_ptr[q], q_read_ptr[q + 1]):
            i = q_readers[r]
            if shard[i, a[i]] != level or cut[i, a[i]] != 0:
                level = 0
        lvl[q] = level
    return lvl


@compiled
def _node_sharded(a, node_q_ptr, node_q, q_bytes, q_ag, lvl, n):  # pragma: no cover - compiled
    """Per node: how many of its parameters are sharded (of nonzero bytes), the seconds of their
    all-gathers one after the other (:func:`~.reshard.shard_steps`), and their whole bytes."""
    cnt = np.zeros(n, dtype=np.int64)
    secs = np.zeros(n)
    whole = np.zeros(n, dtype=np.int64)
    for i in range(n):
        for j in range(node_q_ptr[i], node_q_ptr[i + 1]):
            q = node_q[j]
            if lvl[q] >= 1 and q_bytes[q] > 0:
                cnt[i] += 1
                secs[i] += q_ag[q]
                whole[i] += q_bytes[q]
    return cnt, secs, whole


@compiled
def _synced(a, node_q_ptr, node_q, q_read_ptr, q_readers, q_train, cut, lvl,
            k):  # pragma: no cover - compiled
    """Trainable parameter → whether its gradients are summed (:func:`~.reshard.synced_parameters`
    on one mesh: read on k ≥ 2 devices, not every reader cutting it the same way, and not
    reduce-scattered by a sharding level)."""
    nq = q_train.shape[0]
    out = np.zeros(nq, dtype=np.bool_)
    if k < 2:
        return out
    for q in range(nq):
        if not q_train[q] or q_read_ptr[q] == q_read_ptr[q + 1]:
            continue
        if lvl[q] >= 2:
            continue
        first = cut[q_readers[q_read_ptr[q]], a[q_readers[q_read_ptr[q]]]]
        same = first != 0
        for r in range(q_read_ptr[q] + 1, q_read_ptr[q + 1]):
            i = q_readers[r]
            if cut[i, a[i]] != first:
                same = False
        out[q] = not same
    return out


# ---- time: the simulator's event loop on one mesh --------------------------------------------


@compiled
def _heap_push(keys, ids, size, key, tid):  # pragma: no cover - compiled
    i = size
    keys[i] = key
    ids[i] = tid
    while i > 0:
        parent = (i - 1) // 2
        if keys[parent] < keys[i] or (keys[parent] == keys[i] and ids[parent] < ids[i]):
            break
        keys[parent], keys[i] = keys[i], keys[parent]
        ids[parent], ids[i] = ids[i], ids[parent]
        i = parent
    return size + 1


@compiled
def _heap_pop(keys, ids, size):  # pragma: no cover - compiled
    key, tid = keys[0], ids[0]
    size -= 1
    keys[0], ids[0] = keys[size], ids[size]
    i = 0
    while True:
        left, right, small = 2 * i + 1, 2 * i + 2, i
        if left < size and (keys[left] < keys[small] or (keys[left] == keys[small] and ids[left] < ids[small])):
            small = left
        if right < size and (keys[right] < keys[small] or (keys[right] == keys[small] and ids[right] < ids[small])):
            small = right
        if small == i:
            break
        keys[small], keys[i] = keys[i], keys[small]
        ids[small], ids[i] = ids[i], ids[small]
        i = small
    return key, tid, size


@compiled
def _simulate(a, ncfg, fp, bp, rc, stat, loss_ar, ng, is_out, out_list, fwd_dur, bwd_dur, grad_l, speed, rate,
              ring_lat, ring_bw, slot_node, prod_ptr, prod_slots, blk, keeps0, slot_ptr, slot_ids, slot_prod, read,
              recv, unread, node_q_ptr, node_q, q_read_ptr, q_readers, q_bytes, q_train, pieces, cut, shard, q_ag,
              q_piece, k, micro):  # pragma: no cover - compiled
    """The simulated step time of plan ``a`` (:func:`~.simulate.simulate`'s tasks and event loop): with
    ``micro`` micro-batches, the first ``micro − 1`` without the gradient sums and update gathers."""
    t = _simulate_once(a, ncfg, fp, bp, rc, stat, loss_ar, ng, is_out, out_list, fwd_dur, bwd_dur, grad_l, speed,
                       rate, ring_lat, ring_bw, slot_node, prod_ptr, prod_slots, blk, keeps0, slot_ptr, slot_ids,
                       slot_prod, read, recv, unread, node_q_ptr, node_q, q_read_ptr, q_readers, q_bytes, q_train,
                       pieces, cut, shard, q_ag, q_piece, k, False)
    if micro > 1:
        t += (micro - 1) * _simulate_once(a, ncfg, fp, bp, rc, stat, loss_ar, ng, is_out, out_list, fwd_dur,
                                          bwd_dur, grad_l, speed, rate, ring_lat, ring_bw, slot_node, prod_ptr,
                                          prod_slots, blk, keeps0, slot_ptr, slot_ids, slot_prod, read, recv, unread,
                                          node_q_ptr, node_q, q_read_ptr, q_readers, q_bytes, q_train, pieces, cut,
                                          shard, q_ag, q_piece, k, True)
    return t


@compiled
def _simulate_once(a, ncfg, fp, bp, rc, stat, loss_ar, ng, is_out, out_list, fwd_dur, bwd_dur, grad_l, speed, rate,
                   ring_lat, ring_bw, slot_node, prod_ptr, prod_slots, blk, keeps0, slot_ptr, slot_ids, slot_prod,
                   read, recv, unread, node_q_ptr, node_q, q_read_ptr, q_readers, q_bytes, q_train, pieces, cut, shard,
                   q_ag, q_piece, k, early):  # pragma: no cover - compiled
    """One micro-batch's step of plan ``a``; ``early``: one before the last (no gradient sums, no
    gathers of updated parameters)."""
    n = a.shape[0]
    lvl = _levels(a, q_read_ptr, q_readers, q_train, cut, shard, k)
    synced = _synced(a, node_q_ptr, node_q, q_read_ptr, q_readers, q_train, cut, lvl, k)
    sh_cnt, ag_dur, _ = _node_sharded(a, node_q_ptr, node_q, q_bytes, q_ag, lvl, n)
    seg = _segments(a, rc, ng, blk, keeps0)[0]    # a segment's every node runs its forward again
    cap = 10 * n + 4 * slot_ids.shape[0] + 8
    kind = np.zeros(cap, dtype=np.int64)       # 0 compute, 1 comm, 2 sync
    dur = np.zeros(cap)
    dep_from = np.zeros(4 * cap + 4 * slot_ids.shape[0] + 2 * n, dtype=np.int64)
    dep_to = np.zeros(dep_from.shape[0], dtype=np.int64)
    nd = 0
    nt = 0
    fwd_task = np.full(n, -1, dtype=np.int64)
    bwd_task = np.full(n, -1, dtype=np.int64)
    last_comp = -1                               # the last compute task made (a gather waits for it)
    # forward: one transfer per (producer, read layout, unread) key, made at its first consumer
    nkey = 3 * n * 2
    arrived = np.full(nkey, -2, dtype=np.int64)
    scratch = np.zeros(slot_ids.shape[0] + 4, dtype=np.int64)
    for i in range(n):
        c = a[i]
        m = 0
        for s in range(slot_ptr[i], slot_ptr[i + 1]):
            sl = slot_ids[s]
            p = slot_prod[sl]
            if p < 0:
                continue
            key = (p * 3 + read[sl, c]) * 2 + (1 if unread[i] else 0)
            if arrived[key] == -2:
                d = fwd_dur[sl, a[p], c]
                if d < 0:
                    arrived[key] = fwd_task[p]
                else:
                    kind[nt], dur[nt] = 1, d
                    dep_from[nd], dep_to[nd] = fwd_task[p], nt
                    nd += 1
                    arrived[key] = nt
                    nt += 1
            scratch[m] = arrived[key]
            m += 1
        if shard[i, c] >= 3 and sh_cnt[i] > 0:   # its parameters gathered once the compute before it ends
            kind[nt], dur[nt] = 1, ag_dur[i]
            if last_comp >= 0:
                dep_from[nd], dep_to[nd] = last_comp, nt
                nd += 1
            scratch[m] = nt
            m += 1
            nt += 1
        kind[nt], dur[nt] = 0, fp[i, c] / speed
        for j in range(m):
            seen = False
            for j2 in range(j):
                if scratch[j2] == scratch[j]:
                    seen = True
            if not seen:
                dep_from[nd], dep_to[nd] = scratch[j], nt
                nd += 1
        fwd_task[i] = nt
        last_comp = nt
        nt += 1
        if stat[i, c] >= 0:
            kind[nt], dur[nt] = 1, stat[i, c]
            dep_from[nd], dep_to[nd] = fwd_task[i], nt
            nd += 1
            fwd_task[i] = nt
            nt += 1
    # the loss: every model output (partial sums all-reduced first)
    m = 0
    for o in range(out_list.shape[0]):
        i = out_list[o]
        c = a[i]
        if loss_ar[i, c] >= 0:
            kind[nt], dur[nt] = 1, loss_ar[i, c]
            dep_from[nd], dep_to[nd] = fwd_task[i], nt
            nd += 1
            scratch[m] = nt
            nt += 1
        else:
            scratch[m] = fwd_task[i]
        m += 1
    loss = nt
    kind[nt] = 2
    if m == 0:
        for i in range(n):
            scratch[m] = fwd_task[i]
            m += 1
    for j in range(m):
        seen = False
        for j2 in range(j):
            if scratch[j2] == scratch[j]:
                seen = True
        if not seen:
            dep_from[nd], dep_to[nd] = scratch[j], nt
            nd += 1
    nt += 1
    # backward, in reverse; gradients sent once per (producer, read, unread, gradient layout) key,
    # after the last backward of the consumers that share it
    gb_next = np.full(2 * slot_ids.shape[0] + 2, -1, dtype=np.int64)
    gb_head = np.full(n, -1, dtype=np.int64)
    gb_val = np.zeros(2 * slot_ids.shape[0] + 2, dtype=np.int64)
    ngb = 0
    for r in range(n - 1, -1, -1):
        i = r
        c = a[i]
        m = 0
        e = gb_head[i]
        # grads_back in the order they were appended
        cnt = 0
        while e >= 0:
            cnt += 1
            e = gb_next[e]
        m = cnt
        e = gb_head[i]
        j = cnt - 1
        while e >= 0:
            scratch[j] = gb_val[e]
            j -= 1
            e = gb_next[e]
        if is_out[i] and ng[i]:
            scratch[m] = loss
            m += 1
        if shard[i, c] >= 3 and sh_cnt[i] > 0:   # gathered again for the backward
            kind[nt], dur[nt] = 1, ag_dur[i]
            if last_comp >= 0:
                dep_from[nd], dep_to[nd] = last_comp, nt
                nd += 1
            scratch[m] = nt
            m += 1
            nt += 1
        if seg[i] >= 0:
            kind[nt], dur[nt] = 0, fp[i, c] / speed
            for j in range(m):
                seen = scratch[j] < 0
                for j2 in range(j):
                    if scratch[j2] == scratch[j]:
                        seen = True
                if not seen:
                    dep_from[nd], dep_to[nd] = scratch[j], nt
                    nd += 1
            scratch[0] = nt
            m = 1
            last_comp = nt
            nt += 1
        summed = 0
        for jq in range(node_q_ptr[i], node_q_ptr[i + 1]):
            q = node_q[jq]
            if synced[q]:
                summed += q_bytes[q]
        copy_bytes = summed * (2 if pieces[i, c] > 1 else 1)
        copy_s = copy_bytes / rate if (rate > 0 and copy_bytes > 0) else 0.0
        kind[nt], dur[nt] = 0, (bp[i, c] + copy_s) / speed
        for j in range(m):
            seen = scratch[j] < 0
            for j2 in range(j):
                if scratch[j2] == scratch[j]:
                    seen = True
            if not seen:
                dep_from[nd], dep_to[nd] = scratch[j], nt
                nd += 1
        bwd_task[i] = nt
        last_comp = nt
        nt += 1
        if shard[i, c] >= 2 and sh_cnt[i] > 0:   # its gradients reduce-scattered (as long as a gather)
            kind[nt], dur[nt] = 1, ag_dur[i]
            dep_from[nd], dep_to[nd] = bwd_task[i], nt
            nd += 1
            nt += 1
        if ng[i] and stat[i, c] >= 0:
            kind[nt], dur[nt] = 1, stat[i, c]
            dep_from[nd], dep_to[nd] = bwd_task[i], nt
            nd += 1
            bwd_task[i] = nt
            nt += 1
        # the gradients this node sends its producers
        if not ng[i]:
            continue
        for s in range(slot_ptr[i], slot_ptr[i + 1]):
            sl = slot_ids[s]
            p = slot_prod[sl]
            if p < 0 or not ng[p]:
                continue
            rl = read[sl, c]
            gl = grad_l[sl, a[p], c]
            # the consumers sharing this backward key, in plan order; sent when i is the first of them
            first = -1
            m = 0
            for j2 in range(prod_ptr[p], prod_ptr[p + 1]):
                s2 = prod_slots[j2]
                i2 = slot_node[s2]
                c2 = a[i2]
                if read[s2, c2] != rl or unread[i2] != unread[i] or grad_l[s2, a[p], c2] != gl or not ng[i2]:
                    continue
                if first < 0:
                    first = i2
                scratch[m] = bwd_task[i2]
                m += 1
            if first != i:
                continue
            # the backward stages: those of the key's first consumer's reshard (plan_edges keeps it)
            s_first = -1
            for j2 in range(prod_ptr[p], prod_ptr[p + 1]):
                s2 = prod_slots[j2]
                i2 = slot_node[s2]
                c2 = a[i2]
                if read[s2, c2] == rl and unread[i2] == unread[i] and grad_l[s2, a[p], c2] == gl:
                    s_first = s2
                    break
            d = bwd_dur[s_first, a[p], a[slot_node[s_first]]]
            if d < 0:
                uniq = 0
                last = -1
                for j in range(m):
                    seen = False
                    for j2 in range(j):
                        if scratch[j2] == scratch[j]:
                            seen = True
                    if not seen:
                        uniq += 1
                        last = scratch[j]
                if uniq <= 1:
                    val = last
                else:
                    kind[nt] = 2
                    for j in range(m):
                        seen = False
                        for j2 in range(j):
                            if scratch[j2] == scratch[j]:
                                seen = True
                        if not seen:
                            dep_from[nd], dep_to[nd] = scratch[j], nt
                            nd += 1
                    val = nt
                    nt += 1
            else:
                kind[nt], dur[nt] = 1, d
                for j in range(m):
                    seen = False
                    for j2 in range(j):
                        if scratch[j2] == scratch[j]:
                            seen = True
                    if not seen:
                        dep_from[nd], dep_to[nd] = scratch[j], nt
                        nd += 1
                val = nt
                nt += 1
            gb_val[ngb] = val
            gb_next[ngb] = gb_head[p]
            gb_head[p] = ngb
            ngb += 1
    # the gradients' all-reduce: after the last backward reading a summed parameter
    total = 0
    last = -1
    for q in range(q_bytes.shape[0]):
        if synced[q] and not early:
            total += q_bytes[q]
            r0 = q_readers[q_read_ptr[q]]
            for r in range(q_read_ptr[q], q_read_ptr[q + 1]):
                if q_readers[r] < r0:
                    r0 = q_readers[r]
            if last < 0 or r0 < last:
                last = r0
    if total > 0 or last >= 0:
        chunk = total / k
        step = 0.0
        if chunk != 0:
            for j in range(k):
                t = ring_lat[j] + chunk / ring_bw[j]
                if t > step:
                    step = t
        kind[nt], dur[nt] = 1, 2 * (k - 1) * step
        dep_from[nd], dep_to[nd] = bwd_task[last], nt
        nd += 1
        summed_task = nt
        nt += 1
    else:
        summed_task = -1
    # after the optimizer step: the parameters whose state (not themselves) is sharded are gathered
    upd = 0.0
    nupd = 0
    for q in range(q_bytes.shape[0]):
        if (lvl[q] == 1 or lvl[q] == 2) and q_bytes[q] > 0 and not early:   # one all-gather per parameter
            upd += q_ag[q]
            nupd += 1
    if nupd > 0:
        kind[nt] = 2
        for r in range(n - 1, -1, -1):
            dep_from[nd], dep_to[nd] = bwd_task[r], nt
            nd += 1
        if summed_task >= 0:
            dep_from[nd], dep_to[nd] = summed_task, nt
            nd += 1
        done = nt
        nt += 1
        kind[nt], dur[nt] = 1, upd
        dep_from[nd], dep_to[nd] = done, nt
        nd += 1
        nt += 1
    return _run(kind[:nt], dur[:nt], dep_from[:nd], dep_to[:nd])


@compiled
def _run(kind, dur, dep_from, dep_to):  # pragma: no cover - compiled
    """:meth:`~.simulate._Schedule.run` on one mesh: compute tasks in creation order, one at a
    time; comm tasks on one channel, first come first served by (ready, id); sync tasks end when
    they are ready.  Returns when the last task ends."""
    nt = kind.shape[0]
    nd = dep_from.shape[0]
    pending = np.zeros(nt, dtype=np.int64)
    succ_ptr = np.zeros(nt + 1, dtype=np.int64)
    for e in range(nd):
        pending[dep_to[e]] += 1
        succ_ptr[dep_from[e] + 1] += 1
    for t in range(nt):
        succ_ptr[t + 1] += succ_ptr[t]
    succ = np.zeros(nd, dtype=np.int64)
    fill = succ_ptr[:-1].copy()
    for e in range(nd):          # in creation order of the edges: the order succ lists are built
        succ[fill[dep_from[e]]] = dep_to[e]
        fill[dep_from[e]] += 1
    ready = np.zeros(nt)
    end = np.full(nt, np.nan)
    start = np.full(nt, np.nan)
    heap_k = np.zeros(nt + 1)
    heap_i = np.zeros(nt + 1, dtype=np.int64)
    hs = 0
    cr_k = np.zeros(nt + 1)
    cr_i = np.zeros(nt + 1, dtype=np.int64)
    cs = 0
    wait_k = np.zeros(nt + 1)
    wait_i = np.zeros(nt + 1, dtype=np.int64)
    queue = np.zeros(nt, dtype=np.int64)      # the compute tasks, in creation order
    nq = 0
    for t in range(nt):
        if kind[t] == 0:
            queue[nq] = t
            nq += 1
    head = 0
    dev_free = 0.0
    link_free = 0.0
    now = 0.0
    for t in range(nt):
        if pending[t] == 0:
            if kind[t] == 1:
                cs = _heap_push(cr_k, cr_i, cs, ready[t], t)
            elif kind[t] == 2:
                start[t] = now
                end[t] = now
                hs = _heap_push(heap_k, heap_i, hs, now, t)
    while True:
        progress = True
        while progress:
            progress = False
            if head < nq:
                t = queue[head]
                if pending[t] == 0 and dev_free <= now:
                    start[t] = now
                    end[t] = now + dur[t]
                    dev_free = end[t]
                    head += 1
                    hs = _heap_push(heap_k, heap_i, hs, end[t], t)
                    progress = True
            nw = 0
            started = False
            while cs > 0:
                rk, t, cs = _heap_pop(cr_k, cr_i, cs)
                if link_free <= now:
                    start[t] = now
                    end[t] = now + dur[t]
                    link_free = end[t]
                    hs = _heap_push(heap_k, heap_i, hs, end[t], t)
                    started = True
                else:
                    wait_k[nw] = rk
                    wait_i[nw] = t
                    nw += 1
            for w in range(nw):
                cs = _heap_push(cr_k, cr_i, cs, wait_k[w], wait_i[w])
            progress = progress or started
        if hs == 0:
            break
        now = heap_k[0]
        while hs > 0 and heap_k[0] == now:
            _, tid, hs = _heap_pop(heap_k, heap_i, hs)
            for e in range(succ_ptr[tid], succ_ptr[tid + 1]):
                s = succ[e]
                pending[s] -= 1
                if now > ready[s]:
                    ready[s] = now
                if pending[s] == 0:
                    if kind[s] == 1:
                        cs = _heap_push(cr_k, cr_i, cs, ready[s], s)
                    elif kind[s] == 2:
                        start[s] = now
                        end[s] = now
                        hs = _heap_push(heap_k, heap_i, hs, now, s)
    best = 0.0
    for t in range(nt):
        if end[t] > best:
            best = end[t]
    return best


@compiled
def _simulate_many(vecs, *tables):  # pragma: no cover - compiled
    out = np.zeros(vecs.shape[0])
    for r in range(vecs.shape[0]):
        out[r] = _simulate(vecs[r], *tables)
    return out


# ---- memory: the walk of one device ----------------------------------------------------------


@compiled
def _segments(a, rc, ng, blk, keeps0):  # pragma: no cover - compiled
    """:func:`~.walk.recompute_segments` of :func:`~.walk.fill_segments` on one mesh (what
    :meth:`MeshEvaluator.plan` gives): each node's segment (-1: none; a member is recomputed), and
    per segment its first and last node, its anchor and its regeneration point (-1: no backward)."""
    n = a.shape[0]
    seg = np.full(n, -1, dtype=np.int64)
    lo = np.zeros(n, dtype=np.int64)
    hi = np.zeros(n, dtype=np.int64)
    nseg = 0
    start = -1
    last = -1
    for i in range(n + 1):
        c = a[i] if i < n else 0
        if i < n and rc[i, c] and start >= 0 and blk[i] == blk[start]:
            last = i
            continue
        if i < n and not rc[i, c] and start >= 0 and blk[i] == blk[start] and keeps0[i, c]:
            continue
        if last >= 0:
            for j in range(start, last + 1):
                seg[j] = nseg
            lo[nseg], hi[nseg] = start, last
            nseg += 1
        start = -1
        last = -1
        if i < n and rc[i, c]:
            start = i
            last = i
    anchor = np.full(nseg, -1, dtype=np.int64)
    regen_at = np.full(nseg, -1, dtype=np.int64)
    for sg in range(nseg):
        for j in range(lo[sg], hi[sg] + 1):
            if ng[j]:
                if anchor[sg] < 0:
                    anchor[sg] = j
                regen_at[sg] = j
    return seg, lo[:nseg], hi[:nseg], anchor, regen_at


@compiled
def _pair(pairs, npairs, saver, key, regenerated, nbytes):  # pragma: no cover - compiled
    """Append the row (saver, key, regenerated, bytes) to ``pairs``; returns the new count."""
    pairs[npairs, 0], pairs[npairs, 1], pairs[npairs, 2], pairs[npairs, 3] = saver, key, regenerated, nbytes
    return npairs + 1


@compiled
def _kept(pairs, npairs, last_saver, savers, saver, key):  # pragma: no cover - compiled
    """``saver``'s backward keeps ``key`` from forward on (once per saver): one more saver of it."""
    if last_saver[key] == saver:
        return npairs
    last_saver[key] = saver
    savers[key] += 1
    return _pair(pairs, npairs, saver, key, 0, 0)


@compiled
def _walk(a, out_b, extra, ws, rc, alias, ng, gets, saves_out, widened, out_list, slot_saved, batch_piece, nx,
          q_kind, alpha, adam, context_bytes, blk, keeps0, slot_ptr, slot_ids, slot_prod, read, recv, unread,
          node_q_ptr, node_q, q_read_ptr, q_readers, q_bytes, q_train, pieces, cut, shard, q_ag, q_piece,
          k, micro):  # pragma: no cover - compiled
    """One device's walk (every device's: they hold the same) of plan ``a``, :func:`~.walk.walk`:
    ``[peak, parameters + buffers, gradients, optimizer state, activations, transient, reserve]``
    at the peak (:meth:`~.walk.StepMemory.parts`); with ``micro`` micro-batches the larger of the
    first micro-batch's walk and a later one's."""
    out = _walk_once(a, out_b, extra, ws, rc, alias, ng, gets, saves_out, widened, out_list, slot_saved,
                     batch_piece, nx, q_kind, alpha, adam, context_bytes, blk, keeps0, slot_ptr, slot_ids, slot_prod,
                     read, recv, unread, node_q_ptr, node_q, q_read_ptr, q_readers, q_bytes, q_train, pieces, cut,
                     shard, q_ag, q_piece, k, micro, False)
    if micro > 1:
        later = _walk_once(a, out_b, extra, ws, rc, alias, ng, gets, saves_out, widened, out_list, slot_saved,
                           batch_piece, nx, q_kind, alpha, adam, context_bytes, blk, keeps0, slot_ptr, slot_ids,
                           slot_prod, read, recv, unread, node_q_ptr, node_q, q_read_ptr, q_readers, q_bytes, q_train,
                           pieces, cut, shard, q_ag, q_piece, k, micro, True)
        if later[0] > out[0]:
            return later
    return out


@compiled
def _walk_once(a, out_b, extra, ws, rc, alias, ng, gets, saves_out, widened, out_list, slot_saved, batch_piece, nx,
               q_kind, alpha, adam, context_bytes, blk, keeps0, slot_ptr, slot_ids, slot_prod, read, recv, unread,
               node_q_ptr, node_q, q_read_ptr, q_readers, q_bytes, q_train, pieces, cut, shard, q_ag, q_piece,
               k, micro, later):  # pragma: no cover - compiled
    """One micro-batch's walk: the first (``later`` False: no gradient but the flat buffers yet) or a
    later one (every gradient there from the start), the caller holding ``micro`` micro-batches."""
    n = a.shape[0]
    nq = q_bytes.shape[0]
    lvl = _levels(a, q_read_ptr, q_readers, q_train, cut, shard, k)   # a parameter's sharding level
    synced = _synced(a, node_q_ptr, node_q, q_read_ptr, q_readers, q_train, cut, lvl, k)
    # parameters held, and what stays resident
    held = np.zeros(nq, dtype=np.int64)
    shp = np.zeros(nq, dtype=np.int64)        # its piece over the mesh (⌈numel / k⌉ elements)
    gath = np.zeros(n, dtype=np.int64)        # the whole bytes a node gathers to run (level 3)
    for q in range(nq):
        if lvl[q] >= 1:
            shp[q] = q_piece[q]
    for i in range(n):
        for j in range(node_q_ptr[i], node_q_ptr[i + 1]):
            q = node_q[j]
            if lvl[q] >= 3:
                gath[i] += q_bytes[q]
    for i in range(n):
        for j in range(node_q_ptr[i], node_q_ptr[i + 1]):
            q = node_q[j]
            b = -(-q_bytes[q] // pieces[i, a[i]])
            if synced[q]:
                b = q_bytes[q]
            if lvl[q] >= 3:
                b = shp[q]
            if b > held[q]:
                held[q] = b
    params = 0
    buffers = 0
    grads = 0
    optim = 0
    opt_temp = 0
    prev = 0                   # the per-tensor Adam step: the previous parameter's denom beside two of this one's
    for q in range(nq):
        if q_read_ptr[q] == q_read_ptr[q + 1]:
            continue
        if q_kind[q] == 0:
            params += held[q]
            if q_train[q]:
                grads += shp[q] if lvl[q] >= 2 else held[q]
                state = shp[q] if lvl[q] >= 1 else held[q]
                optim += alpha * state
                if prev + 2 * state > opt_temp:
                    opt_temp = prev + 2 * state
                prev = state
        else:
            buffers += held[q]
    if not adam:
        opt_temp = 0
    # storage keys: outputs [0, n), batch [n, n + nx), received copies [n + nx, n + nx + 3n) by
    # (producer, read layout), extra saved tensors [.., + n)
    kb, kr, ke = n, n + nx, n + nx + 3 * n
    kg = ke + n              # a node's gathered parameters, made again by its segment's recomputation
    nk = kg + n
    size = np.zeros(nk, dtype=np.int64)
    owner = np.zeros(n, dtype=np.int64)
    ns = slot_ids.shape[0]
    rkey = np.zeros(ns, dtype=np.int64)                  # the storage key each input slot reads
    fk_recv = np.full(6 * n, -1, dtype=np.int64)         # first consumer's received bytes per forward key
    batch = np.zeros(nx, dtype=np.int64)
    has_batch = np.zeros(nx, dtype=np.bool_)
    for i in range(n):
        c = a[i]
        for s in range(slot_ptr[i], slot_ptr[i + 1]):
            sl = slot_ids[s]
            p = slot_prod[sl]
            if p < 0:
                x = -1 - p
                has_batch[x] = True
                if batch_piece[sl, c] > batch[x]:
                    batch[x] = batch_piece[sl, c]
                rkey[sl] = kb + x
                continue
            fk = (p * 3 + read[sl, c]) * 2 + (1 if unread[i] else 0)
            if fk_recv[fk] < 0:
                fk_recv[fk] = recv[sl, a[p], c]
            r = fk_recv[fk]
            if r > 0:
                key = kr + p * 3 + read[sl, c]
                size[key] = r
                rkey[sl] = key
            else:
                rkey[sl] = owner[p]
        if alias[i] and slot_ptr[i + 1] > slot_ptr[i]:
            owner[i] = rkey[slot_ids[slot_ptr[i]]]
        else:
            owner[i] = i
            size[i] = out_b[i, c]
    end = n + 1
    seg, seg_lo, seg_hi, anchor, regen_at = _segments(a, rc, ng, blk, keeps0)
    last_use = np.full(nk, -1, dtype=np.int64)
    savers = np.zeros(nk, dtype=np.int64)
    last_saver = np.full(nk, -1, dtype=np.int64)
    # (saver, key, regenerated) pairs: a key a node's backward needs; regenerated ones are made
    # again by their segment's recomputation (counted from its regeneration point)
    cap = ns + 3 * n + 1
    pairs = np.zeros((cap, 4), dtype=np.int64)   # rows (saver, key, regenerated, bytes)
    npairs = 0
    for i in range(n):
        c = a[i]
        sg = seg[i]
        regen = sg >= 0 and ng[i] and regen_at[sg] >= 0   # its saved tensors are made again
        if owner[i] == i and i > last_use[i]:
            last_use[i] = i
        for s in range(slot_ptr[i], slot_ptr[i + 1]):
            sl = slot_ids[s]
            kk = rkey[sl]
            p = slot_prod[sl]
            if i > last_use[kk]:
                last_use[kk] = i
            if sg < 0:
                if slot_saved[sl]:
                    npairs = _kept(pairs, npairs, last_saver, savers, i, kk)
            elif p >= 0 and seg[p] == sg:      # made inside the segment: recomputed with it
                if slot_saved[sl] and regen:
                    npairs = _pair(pairs, npairs, i, kk, 1, size[kk])
            elif anchor[sg] >= 0:              # the segment's input: kept until its last backward
                npairs = _kept(pairs, npairs, last_saver, savers, anchor[sg], kk)
        if saves_out[i]:
            if sg < 0:
                npairs = _kept(pairs, npairs, last_saver, savers, i, owner[i])
            elif regen:
                npairs = _pair(pairs, npairs, i, owner[i], 1, size[owner[i]])
        # the extra saved tensors are saved in forward (below), after these
        if extra[i, c] > 0:
            if sg < 0:
                npairs = _kept(pairs, npairs, last_saver, savers, i, ke + i)
            elif regen:
                npairs = _pair(pairs, npairs, i, ke + i, 1, extra[i, c])
        if regen and shard[i, c] >= 3 and gath[i] > 0:
            npairs = _pair(pairs, npairs, i, kg + i, 1, gath[i])
    # per saver, its pairs (a counting sort, stable)
    saved_ptr = np.zeros(n + 1, dtype=np.int64)
    for j in range(npairs):
        saved_ptr[pairs[j, 0] + 1] += 1
    for i in range(n):
        saved_ptr[i + 1] += saved_ptr[i]
    fill = saved_ptr[:n].copy()
    saved_keys = np.zeros(npairs, dtype=np.int64)
    saved_regen = np.zeros(npairs, dtype=np.bool_)
    saved_bytes = np.zeros(npairs, dtype=np.int64)
    for j in range(npairs):
        at = fill[pairs[j, 0]]
        fill[pairs[j, 0]] += 1
        saved_keys[at], saved_regen[at], saved_bytes[at] = pairs[j, 1], pairs[j, 2] != 0, pairs[j, 3]
    rlive = np.zeros(nk, dtype=np.bool_)     # a regenerated copy of the key is live
    rlive_b = np.zeros(nk, dtype=np.int64)
    rsavers = np.zeros(nk, dtype=np.int64)
    rsum = 0
    for o in range(out_list.shape[0]):
        last_use[owner[out_list[o]]] = end
    is_batch = np.zeros(nk, dtype=np.bool_)
    for x in range(nx):
        is_batch[kb + x] = True
    live = np.zeros(nk, dtype=np.bool_)
    live_b = np.zeros(nk, dtype=np.int64)
    held_now = 0
    base = params + buffers + optim + context_bytes
    peak = 0
    gsum = 0
    p_grads = p_act = p_tr = 0
    for x in range(nx):
        if has_batch[x]:   # the caller holds the step's batch: every micro-batch of it
            live[kb + x] = True
            live_b[kb + x] = batch[x] * micro
            held_now += batch[x] * micro
    # the gradients summed across devices live in one flat buffer all step; a later micro-batch has every one
    grads_now = 0
    for q in range(nq):
        if synced[q] and q_read_ptr[q] < q_read_ptr[q + 1]:
            grads_now += held[q]
    if later:
        grads_now = grads
    t = base + grads_now + held_now
    if t > peak:
        peak, p_grads, p_act, p_tr = t, grads_now, held_now, gsum
    # forward; a key nothing saves (before the extra saved tensors) is freed after its last reader
    for i in range(n):
        c = a[i]
        for s in range(slot_ptr[i], slot_ptr[i + 1]):
            kk = rkey[slot_ids[s]]
            if not live[kk]:
                live[kk] = True
                live_b[kk] = size[kk]
                held_now += size[kk]
        if owner[i] == i:
            if live[i]:
                held_now -= live_b[i]
            live[i] = True
            live_b[i] = size[i]
            held_now += size[i]
        ex = ke + i
        if extra[i, c] > 0:
            if live[ex]:
                held_now -= live_b[ex]
            live[ex] = True
            live_b[ex] = extra[i, c]
            held_now += extra[i, c]
        gat = gath[i] if shard[i, c] >= 3 else 0
        t = base + grads_now + held_now + ws[i, c] + gat
        if t > peak:
            peak, p_grads, p_act, p_tr = t, grads_now, held_now + ws[i, c] + gat, gsum + ws[i, c] + gat
        if seg[i] >= 0 and live[ex]:
            live[ex] = False
            held_now -= live_b[ex]
        # free what was last read here and is saved by no backward
        for s in range(slot_ptr[i], slot_ptr[i + 1]):
            kk = rkey[slot_ids[s]]
            if last_use[kk] == i and savers[kk] == 0 and not is_batch[kk] and live[kk]:
                live[kk] = False
                held_now -= live_b[kk]
        if owner[i] == i and last_use[i] == i and savers[i] == 0 and live[i]:
            live[i] = False
            held_now -= live_b[i]
    for kk in range(nk):
        if live[kk] and last_use[kk] >= end and savers[kk] == 0:
            live[kk] = False
            held_now -= live_b[kk]
    # backward
    gkey = np.zeros(nk, dtype=np.bool_)      # keys with a gradient (grad_keys)
    glive = np.zeros(nk, dtype=np.bool_)
    glive_b = np.zeros(nk, dtype=np.int64)
    recv_users = np.zeros(nk, dtype=np.int64)
    for i in range(n):
        if not ng[i]:
            continue
        for s in range(slot_ptr[i], slot_ptr[i + 1]):
            sl = slot_ids[s]
            p = slot_prod[sl]
            kk = rkey[sl]
            if kr <= kk < ke and p >= 0 and ng[p]:
                recv_users[kk] += 1
    wide = 0
    for o in range(out_list.shape[0]):
        p = out_list[o]
        kk = owner[p]
        if ng[p]:
            gkey[kk] = True
            b = size[kk]
            if glive[kk]:
                held_now -= glive_b[kk]
                gsum -= glive_b[kk]
            glive[kk] = True
            glive_b[kk] = b
            held_now += b
            gsum += b
            if widened[p]:
                wide += 2 * b
    if wide:
        t = base + grads_now + held_now + wide
        if t > peak:
            peak, p_grads, p_act, p_tr = t, grads_now, held_now + wide, gsum + wide
    done = synced.copy()
    any_summed = False
    # a summed gradient read by several operators (a tied weight): autograd sums the contributions before
    # the flat buffer gets them — the first waits for the others (walk.py's rule)
    left = np.zeros(nq, dtype=np.int64)
    waiting = np.zeros(nq, dtype=np.int64)
    for q in range(nq):
        if synced[q] and q_read_ptr[q] < q_read_ptr[q + 1]:
            any_summed = True
        if synced[q] or (later and lvl[q] >= 2):   # a later micro-batch's tied sharded weight: its block waits too
            for r in range(q_read_ptr[q], q_read_ptr[q + 1]):
                if ng[q_readers[r]]:              # a reader without a backward adds nothing
                    left[q] += 1
    for i in range(n - 1, -1, -1):
        if not ng[i]:
            continue
        c = a[i]
        own = owner[i]
        sg = seg[i]
        if sg >= 0 and regen_at[sg] == i:   # the segment's forward runs again, all of it
            for j in range(saved_ptr[seg_lo[sg]], saved_ptr[seg_hi[sg] + 1]):
                if saved_regen[j]:
                    kk = saved_keys[j]
                    if not live[kk]:
                        rsavers[kk] += 1
                        if not rlive[kk]:
                            rlive[kk] = True
                            rlive_b[kk] = saved_bytes[j]
                            held_now += saved_bytes[j]
                            rsum += saved_bytes[j]
            passing = 0               # while it runs: the largest of its outputs nothing keeps
            for j in range(seg_lo[sg], seg_hi[sg] + 1):
                if owner[j] == j and not live[j] and not rlive[j] and size[j] > passing:
                    passing = size[j]
            t = base + grads_now + held_now + passing
            if t > peak:
                peak, p_grads, p_act, p_tr = t, grads_now, held_now + passing, gsum + rsum + passing
        scratch = 0
        if own == i and not gkey[own] and gets[i]:
            gkey[own] = True
            if glive[own]:
                held_now -= glive_b[own]
                gsum -= glive_b[own]
            glive[own] = True
            glive_b[own] = size[own]
            held_now += size[own]
            gsum += size[own]
        for s in range(slot_ptr[i], slot_ptr[i + 1]):
            sl = slot_ids[s]
            p = slot_prod[sl]
            kk = rkey[sl]
            if p < 0 or not ng[p] or gkey[kk]:
                continue
            owned = kk == p or (kr <= kk < ke)
            gkey[kk] = True
            b = size[kk] if owned else 0
            if glive[kk]:
                held_now -= glive_b[kk]
                gsum -= glive_b[kk]
            glive[kk] = True
            glive_b[kk] = b
            held_now += b
            gsum += b
        acc = 0
        summing = 0
        held_after = 0
        rs = 0                            # alive in the reduce-scatter after the backward (walk.py's rule)
        rs_pieces = 0
        rs_freed = 0
        for j in range(node_q_ptr[i], node_q_ptr[i + 1]):
            q = node_q[j]
            if not q_train[q]:
                continue
            b = held[q]
            if lvl[q] >= 2:               # made whole, reduce-scattered after the backward: its piece stays
                acc += q_bytes[q]
                rs += q_bytes[q]
                if later:                 # the piece is there: each block added in, a tied one's first waiting
                    left[q] -= 1
                    if not done[q] and left[q] > 0:
                        done[q] = True
                        rs_pieces += shp[q]
                        waiting[q] = shp[q]
                    else:
                        rs += shp[q]
                        if left[q] == 0:
                            rs_freed += waiting[q]
                            waiting[q] = 0
                elif not done[q]:
                    done[q] = True
                    rs_pieces += shp[q]
                else:                     # a tied weight's later reader: its block added in
                    rs += shp[q]
                continue
            if not done[q]:
                done[q] = True
                if later:                 # made, then added into the gradient already there
                    acc += b
                else:
                    grads_now += b
            elif synced[q]:
                piece = -(-q_bytes[q] // pieces[i, c])
                acc += piece + (b if piece < b else 0)
                left[q] -= 1
                if waiting[q] > 0:    # summed after this backward with the waiting one: it (padded) and the sum
                    summing += b + b
                    if left[q] == 0:
                        held_after -= waiting[q]
                        waiting[q] = 0
                elif left[q] > 0:
                    waiting[q] = b
                    held_after += b
            else:
                acc += 2 * (-(-q_bytes[q] // pieces[i, c]))
        regath = gath[i] if shard[i, c] >= 3 and not rlive[kg + i] else 0
        extra_now = scratch + acc + ws[i, c] + regath
        t = base + grads_now + held_now + extra_now
        if t > peak:
            peak, p_grads, p_act, p_tr = t, grads_now, held_now + extra_now, gsum + rsum + extra_now
        if own == i and glive[own]:
            glive[own] = False
            held_now -= glive_b[own]
            gsum -= glive_b[own]
        if summing:
            t = base + grads_now + held_now + summing
            if t > peak:
                peak, p_grads, p_act, p_tr = t, grads_now, held_now + summing, gsum + rsum + summing
        grads_now += held_after
        for j in range(saved_ptr[i], saved_ptr[i + 1]):
            kk = saved_keys[j]
            if saved_regen[j]:
                if rsavers[kk] > 0:
                    rsavers[kk] -= 1
                    if rsavers[kk] == 0 and rlive[kk]:
                        rlive[kk] = False
                        held_now -= rlive_b[kk]
                        rsum -= rlive_b[kk]
                continue
            savers[kk] -= 1
            if savers[kk] == 0 and not is_batch[kk] and live[kk]:
                live[kk] = False
                held_now -= live_b[kk]
        for s in range(slot_ptr[i], slot_ptr[i + 1]):
            sl = slot_ids[s]
            p = slot_prod[sl]
            kk = rkey[sl]
            if kr <= kk < ke and p >= 0 and ng[p]:
                recv_users[kk] -= 1
                if recv_users[kk] == 0 and glive[kk]:
                    glive[kk] = False
                    held_now -= glive_b[kk]
                    gsum -= glive_b[kk]
        if rs:   # the sharding gate's backward: the wholes reduce-scattered, the regathered whole dropped then
            grads_now += rs_pieces
            t = base + grads_now + held_now + rs + regath
            if t > peak:
                peak, p_grads, p_act, p_tr = t, grads_now, held_now + rs + regath, gsum + rsum + rs + regath
            grads_now -= rs_freed         # the waiting blocks added into their pieces
    if any_summed:
        t = base + grads_now + held_now
        if t > peak:
            peak, p_grads, p_act, p_tr = t, grads_now, held_now, gsum + rsum
    # the optimizer step: the batch, every gradient, the state and the temporaries
    keep = 0
    for x in range(nx):
        if live[kb + x]:
            keep += live_b[kb + x]
    t = base + grads + keep + opt_temp
    if t > peak:
        peak, p_grads, p_act, p_tr = t, grads, keep + opt_temp, opt_temp
    out = np.zeros(7, dtype=np.int64)
    out[0], out[1], out[2], out[3] = peak, params + buffers, p_grads, optim
    out[4], out[5], out[6] = p_act - p_tr, p_tr, context_bytes
    return out


@compiled
def _walk_many(vecs, *tables):  # pragma: no cover - compiled
    out = np.zeros(vecs.shape[0], dtype=np.int64)
    for r in range(vecs.shape[0]):
        out[r] = _walk(vecs[r], *tables)[0]
    return out


# ---- compiled ahead ---------------------------------------------------------------------------


def tiny_tables(path: Path = TINY_TABLES) -> dict[str, tuple[Any, ...]]:
    """The tables saved in ``path`` (:func:`~.meshplan.write_tiny_tables`), as the evaluator holds
    them: ``{"walk": (...), "time": (...)}``, a 0-d array read back as its Python scalar."""
    out: dict[str, list[Any]] = {"walk": [], "time": []}
    with np.load(path) as saved:
        for name in sorted(saved.files):   # "walk_00", "walk_01", ...
            x = saved[name]
            out[name.split("_")[0]].append(x.item() if x.ndim == 0 else x)
    return {k: tuple(v) for k, v in out.items()}


def _compile_ahead(table: str) -> None:
    """The evaluator's kernels on ``table`` — ``"walk"``, the memory walk (about 9 s to compile), or
    ``"time"``, the simulator (about 7 s) — of many plans and of one, on the tiny evaluator's
    tables (:mod:`tensoropt._kernels`: each in a process of its own)."""
    kernel: dict[str, tuple[Any, Any]] = {"walk": (_walk_many, _walk), "time": (_simulate_many, _simulate)}
    many, one = kernel[table]
    tables = tiny_tables()[table]
    vecs = np.zeros((2, len(tables[0])), dtype=np.int64)
    many(vecs, *tables)
    one(vecs[0], *tables)


kernels.ahead(partial(_compile_ahead, "walk"))
kernels.ahead(partial(_compile_ahead, "time"))
