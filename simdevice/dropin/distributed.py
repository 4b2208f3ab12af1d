"""``torch.distributed`` during a session: the default process group is the simulated world of the calling actor.

A host actor that is no rank is a world of one; under ``spawn_ranks`` (``DropIn.run(fn, world_size=N)``) every
rank's calls meet its peers'. Collectives are the runtime's: each rank's send, the rendezvous, its receive on
its ``nccl`` stream; a blocking call makes the current stream wait for the receive (as NCCL does), an
``async_op=True`` one returns a work handle whose ``wait()`` does; ``barrier`` and the object collectives
block the host. The rooted calls write only where NCCL writes: ``broadcast`` the others' buffers, ``reduce`` and
``gather`` the destination's, ``scatter`` each rank's from the source's list. Point-to-point calls (``send``,
``recv``, ``isend``, ``irecv``, ``batch_isend_irecv``) run on the stream of their pair of ranks, a batch on the
collectives' stream (``Runtime.point_to_point``). ``new_group`` makes a group of every rank or of some
(:class:`_Group`): a communicator of its own, whose calls take their roots and peers as global ranks (or group ranks:
``group_src``, ``group_dst``, ``group_peer``) and run among its members, in group ranks; a rank outside it is handed
``GroupMember.NON_GROUP_MEMBER``, and its calls on that value do as torch's do (most warn and return None). A
group whose CPU backend is gloo (``"gloo"``, ``"cpu:gloo,cuda:nccl"``) runs collectives of host tensors as gloo
does (``_gloo_exchange``: one host step, no stream; its barrier orders the hosts alone). The calls it does not
run (``NOT_SIMULATED``: ``monitored_barrier``, ``split_group``, ...) raise NotImplementedError naming themselves,
so a run that reaches one gives no verdict instead of the real process group's error.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import torch
import torch.distributed as dist

from reference.contract import torchrun_variables
from simdevice.api import SimWork, SimWorkFuture, refuse_the_rest
from simdevice.dispatch import SIMULATOR_ATTRIBUTES, SimTensor, handle_namespace, ref_of, storage_of
from simdevice.dropin import ddp
from simdevice.dropin.facade import in_actor, session_device
from simdevice.dropin.patches import Patches
from simdevice.dropin.pickling import pickled, unpickled
from simdevice.runtime.collectives import Splits, in_memory_order
from simdevice.runtime.reports import user_source


@refuse_the_rest(dist.ProcessGroup, "ProcessGroup", "torch.distributed's functions given the group are")
class _Group(dist.ProcessGroup):
    """A process group as ``torch.distributed`` hands it out: the default one (:data:`WORLD`, id 0), or one
    ``new_group`` made (ids 1, 2, ... in the order each rank made them, as torch requires every rank to call
    ``new_group`` for every group, member or not, in one order), of every rank (``members`` None) or of the global
    ranks ``members``, in the order of their ranks in the group (sorted, unless ``sort_ranks=False``). Each is a
    ProcessGroupNCCL of its own: a communicator whose collectives match only each other's, and a stream of its own on
    each member rank (``pg1-nccl``), which waits for the calling stream and for nothing of another group's. An
    instance of torch's ``ProcessGroup`` (DTensor's and DeviceMesh's code test it): its methods that run collectives
    raise NotImplementedError (``torch.distributed``'s functions given the group run them), as does any other of
    torch's class this one does not define."""

    #: torch's answer for a group made without ``device_id`` (DeviceMesh makes its subgroups with ``new_group`` then)
    bound_device_id = None

    def __init__(self, gid: int, members: tuple[int, ...] | None = None) -> None:
        super().__init__(0, 1)  # (torch's C++ half, which no simulated call reads: rank and size are the methods')
        self.gid = gid
        self.members = members

    @property
    def group_name(self) -> str:
        """torch's name of the group (the default one's ``"0"``, the k-th ``new_group``'s ``"k"``), by which torch's
        code finds it again (``_resolve_process_group``: DeviceMesh keeps its groups' names)."""
        return str(self.gid)

    def size(self) -> int:
        return get_world_size() if self.members is None else len(self.members)

    def rank(self) -> int:
        return get_rank() if self.members is None else self.members.index(get_rank())

    @property
    def _device_types(self) -> list[torch.device]:
        """The devices of its backends, as ProcessGroup's property names them (torch's own code reads it: an NCCL
        group's is CUDA alone, so ``torch.distributed.checkpoint.async_save`` raises as on a GPU, for want of a CPU
        backend; a group with gloo's has the CPU's too)."""
        return [torch.device(d) for d in _backends(self.gid)[1]]

    # (torch's ``_coalescing_manager`` launches what its block recorded through these, at its end)
    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return _coalesced_launch(self, getattr(opts, "reduceOp", dist.ReduceOp.SUM))

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> Any:
        return _coalesced_launch(self, None)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> Any:
        return _coalesced_launch(self, getattr(opts, "reduceOp", dist.ReduceOp.SUM))

    # (an older torch's names for the two)
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _start_coalescing(self, device: Any) -> None:
        """``_coalescing_manager(group, device=...)``: the block's launches are its end's one work."""
        dev = session_device()
        dev.coalescing[(dev.runtime.current().process, "started", id(self))] = []

    def _end_coalescing(self, device: Any) -> Any:
        dev = session_device()
        works = dev.coalescing.pop((dev.runtime.current().process, "started", id(self)), [])
        return _CoalescedWork(works)

    def __repr__(self) -> str:
        if self.gid == 0:
            return "<simulated process group: the whole world>"
        if self.members is None:
            return f"<simulated process group {self.gid}: every rank of the world (new_group)>"
        return f"<simulated process group {self.gid}: ranks {list(self.members)} (new_group)>"


#: what ``new_group`` hands a rank that is not one of the group's (torch's value, -100)
NON_GROUP_MEMBER: Any = dist.GroupMember.NON_GROUP_MEMBER


def _non_member(group: Any) -> bool:
    """torch's ``_rank_not_in_group``: ``group`` is what ``new_group`` handed a rank outside the group."""
    return not isinstance(group, _Group) and group is not None and group == NON_GROUP_MEMBER


def _outside(group: Any, name: str, stacklevel: int = 3) -> bool:
    """A call on ``GroupMember.NON_GROUP_MEMBER``: torch's warning (``_warn_not_in_group``; at the program's call),
    and True, where torch's call then returns None (having run nothing)."""
    if not _non_member(group):
        return False
    warnings.warn(f"Running {name} on global rank {get_rank()} which does not belong to the given group.",
                  stacklevel=stacklevel)
    return True


WORLD = _Group(0)

#: the collectives and point-to-point calls that run on the simulated process group
SIMULATED = (
    "all_gather", "all_gather_into_tensor", "all_gather_object", "all_gather_single", "all_reduce", "all_to_all",
    "all_to_all_single", "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list", "gather",
    "gather_object", "irecv", "isend", "recv", "reduce", "reduce_scatter", "reduce_scatter_single",
    "reduce_scatter_tensor", "scatter", "scatter_object_list", "send",
)


def _reduce(op: Any, sent: list[torch.Tensor]) -> torch.Tensor:
    stacked = torch.stack([t.reshape(-1) for t in sent])
    r = dist.ReduceOp
    if op == r.SUM:
        return stacked.sum(0)
    if op == r.AVG:
        return stacked.mean(0) if stacked.dtype.is_floating_point else stacked.sum(0) // len(sent)
    if op == r.MAX:
        return stacked.max(0).values
    if op == r.MIN:
        return stacked.min(0).values
    if op == r.PRODUCT:
        return stacked.prod(0)
    # (a ReduceOp made with an argument, ``_make_nccl_premul_sum(0.5)``, says its kind in ``op``)
    if getattr(op, "op", None) == r.RedOpType.PREMUL_SUM:
        # NCCL's ncclRedOpCreatePreMulSum: each rank's input multiplied by the factor, then summed (FSDP's gradient
        # division); a factor given as a tensor is read on the device by NCCL, which is not simulated
        factor = op.factor
        if isinstance(factor, torch.Tensor):
            raise NotImplementedError("reduce op PREMUL_SUM with a tensor factor is not simulated (a float factor is)")
        return (stacked * factor).sum(0)
    raise NotImplementedError(f"reduce op {getattr(op, 'op', op)} is not simulated")


def _finish(gather: Any, async_op: bool, *tensors: torch.Tensor, outputs: int = 1) -> SimWork | None:
    """The collective's work, or None where not ``async_op`` (its ``wait()`` made): ``tensors`` those it reads and
    writes, its ``outputs`` first (its future's value, as ProcessGroupNCCL's ``outputs_``)."""
    work = SimWork(session_device(), gather, tensors, outputs=outputs)
    if async_op:
        return work
    work.wait()  # as NCCL: the current stream waits for the collective; the host goes on
    return None


def _check_nccl_op(op: Any, t: torch.Tensor) -> None:
    """ProcessGroupNCCL's check of a reduction it hands to NCCL (``getNcclReduceOp``), made at the call: no
    bitwise op (``ValueError``, as torch 2.11 raises it on an H100: docs/confirmations.md, sixty-fifth run), no average
    of booleans (a sum of booleans is NCCL's max, the same values)."""
    kind = getattr(op, "op", None) or op
    name = getattr(kind, "name", "")
    if t.dtype == torch.bool and op == dist.ReduceOp.AVG:
        raise TypeError("Cannot use ReduceOp.AVG with boolean inputs")
    if name in ("BAND", "BOR", "BXOR"):
        raise ValueError(f"Cannot use ReduceOp.{name} with NCCL")


def _launched(group: Any, gid: int, kind: str, redop: Any, issue: Callable[[Any], Any], async_op: bool,
              *tensors: torch.Tensor) -> Any:
    """A collective NCCL's process group coalesces (``all_reduce``, ``all_gather_into_tensor``,
    ``reduce_scatter_tensor``; ``tensors`` its output, then its input where they differ): issued now
    (``issue(redop)``: its gather) and finished as :func:`_finish` does; or, inside torch's ``_coalescing_manager``
    block of its group, recorded there as torch records it (the launch at the block's end: :meth:`_Group.
    allreduce_coalesced` and kin), giving ``_IllegalWork()`` where ``async_op`` (torch's: its ``wait()`` raises),
    else None."""
    group = group if isinstance(group, _Group) else WORLD
    recorded = dist.distributed_c10d._world.pg_coalesce_state.get(group)
    if recorded is None:
        return _finish(issue(redop), async_op, *tensors)
    c10d = dist.distributed_c10d
    if kind == "all_reduce":
        op = _CollOp(c10d.all_reduce, tensors[0], None, redop, None)
    elif kind == _ALL_GATHER:
        op = _CollOp(getattr(c10d, "all_gather_single", c10d.all_gather_into_tensor), tensors[1], tensors[0])
    else:
        op = _CollOp(getattr(c10d, "reduce_scatter_single", c10d.reduce_scatter_tensor), tensors[1], tensors[0],
                     redop, None)
    issues = _issues(group)
    if not recorded:
        issues.clear()  # (a block starts: what an earlier one left, raising at its end, is gone with torch's list)
    recorded.append(op)
    issues.append((issue, tensors))
    return c10d._IllegalWork() if async_op else None


_CollOp = dist.distributed_c10d._CollOp


def _issues(group: _Group) -> list[tuple[Callable[[Any], Any], tuple[torch.Tensor, ...]]]:
    """The launches a coalescing block of the calling process recorded on ``group``, in order."""
    dev = session_device()
    return dev.coalescing.setdefault((dev.runtime.current().process, id(group)), [])  # type: ignore[no-any-return]


def _coalesce_state(world: Any) -> Any:
    """``_World.pg_coalesce_state`` in a run: each process's own (torch keeps one per process, and the ranks of a
    simulated world share this interpreter), what ``_coalescing_manager`` and the collectives record in."""
    if not in_actor():
        return world._pg_coalesce_state
    dev = session_device()
    return dev.coalescing.setdefault(dev.runtime.current().process, {})


def _coalesced_launch(group: _Group, redop: Any) -> _CoalescedWork:
    """The end of torch's ``_coalescing_manager`` block on ``group``: what it recorded launched together, in order,
    on the group's stream, each reduction with ``redop`` (the first one's, as torch passes it); their one work. A
    run that coalesces offers no ``replay --gpu``."""
    dev = session_device()
    issues = list(_issues(group))
    _issues(group).clear()
    dev.runtime.gpu_replay = False
    work = _CoalescedWork([SimWork(dev, issue(redop), tensors, outputs=1) for issue, tensors in issues])
    started = dev.coalescing.get((dev.runtime.current().process, "started", id(group)))
    if started is not None:
        started.append(work)
    return work


@refuse_the_rest(dist.Work, "Work", "wait(), synchronize(), is_completed() and result() on a coalesced work are")
class _CoalescedWork(dist.Work):
    """The one work of the collectives a ``_coalescing_manager`` block launched together: ``wait()`` and
    ``synchronize()`` make the current stream wait for each, ``is_completed()`` whether all are done."""

    def __init__(self, works: list[Any]) -> None:
        super().__init__()
        self._works = works

    def wait(self, timeout: Any = None) -> bool:
        for w in self._works:
            w.wait(timeout)
        return True

    def synchronize(self) -> None:
        for w in self._works:
            w.synchronize()

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def result(self) -> list[torch.Tensor]:
        return [t for w in self._works for t in w.result()]


def _check_tensor(t: torch.Tensor) -> None:
    """ProcessGroupNCCL's check of a tensor it hands to NCCL (``check_gpu_single_tensor``), made at the call: a
    device tensor, contiguous (NCCL reads and writes its bytes in order: a strided view is refused, not copied)."""
    if not isinstance(t, torch.Tensor) or not t.is_cuda or t.is_sparse:
        raise ValueError("Tensors must be CUDA and dense")
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}  # (what ``suggest_memory_format`` may answer)
    if not t.is_contiguous() and not (t.dim() in formats and t.is_contiguous(memory_format=formats[t.dim()])):
        raise ValueError("Tensors must be contiguous")


def _check_pair(output: torch.Tensor, input: torch.Tensor, output_per_input: int, input_per_output: int,
                type_error: str, size_error: str) -> None:
    """ProcessGroupNCCL's checks of a collective from one tensor into another (``_allgather_base``,
    ``_reduce_scatter_base``): both device tensors, contiguous, of one dtype, their sizes in the ratio given."""
    _check_tensor(output)
    _check_tensor(input)
    if output.dtype != input.dtype:
        raise TypeError(type_error)
    if output.numel() * input_per_output != input.numel() * output_per_input:
        raise ValueError(size_error)


def _check_group(group: Any) -> int:
    """The id of the process group a call names (0: the default one, also for None and ``dist.group.WORLD``; a
    ``new_group``'s own otherwise)."""
    _initialized()
    if group is None or group is dist.group.WORLD:
        return 0
    if not isinstance(group, _Group):
        raise NotImplementedError("only the process groups torch.distributed made in the run are simulated (the "
                                  "default one, and those new_group made)")
    if (session_device().runtime.current().process, group.gid) in session_device().subgroups_destroyed:
        raise RuntimeError(f"{group!r} was destroyed (destroy_process_group): it runs no collective")
    return group.gid


def _initialized() -> None:
    """torch's check that the default process group exists (gone after ``destroy_process_group``)."""
    if not is_initialized():
        raise ValueError("Default process group has not been initialized, please make sure to call "
                         "init_process_group.")


def is_initialized() -> bool:
    """The actor's world is its default process group from its start (a program need not call
    ``init_process_group``), until ``destroy_process_group``."""
    dev = session_device()
    return dev.runtime.current().process not in dev.groups_destroyed


#: a process group's backend where the program names none (torch's ``BackendConfig`` of ``Backend.UNDEFINED``: the
#: accelerator's alone, NCCL): its name as ``get_backend`` gives it, and the backend of each device type
_NCCL: tuple[str, dict[str, str]] = ("nccl", {"cuda": "nccl"})
#: the device types and backends the simulated process groups run
_SIMULATED_BACKENDS = {("cuda", "nccl"), ("cpu", "gloo"), ("cuda", "gloo")}


def _backends_of(backend: Any) -> tuple[str, dict[str, str]]:
    """A process group's backends as torch's ``BackendConfig`` makes them of ``backend``: ``"nccl"`` (or none) CUDA's
    alone, ``"gloo"`` the CPU's and CUDA's, ``"cpu:gloo,cuda:nccl"`` each device type's. Another backend (``mpi``,
    ``ucc``) is refused: its collectives are not simulated, so the run gives no verdict rather than another
    backend's (a gloo barrier taken for NCCL's waited for the current stream, and hid the race of a host read after
    it)."""
    text = "" if backend is None else str(backend).strip().lower()
    if text in ("", "undefined", "nccl"):
        return _NCCL
    if text == "gloo":
        return "gloo", {"cpu": "gloo", "cuda": "gloo"}
    pairs: dict[str, str] = {}
    if ":" in text:
        for pair in text.split(","):
            device, sep, name = (part.strip() for part in pair.partition(":"))
            if not sep or not device or not name or ":" in name:
                raise ValueError(f"Invalid device:backend pairing: {pair}. The custom backend string must be in "
                                 "the format \"<device_type1>:<backend1>,<device_type2>:<backend2>...\"")
            if device in pairs:
                raise ValueError(f"Duplicate device type {device} in backend string: {text}")
            pairs[device] = name
        if set(pairs.items()) <= _SIMULATED_BACKENDS:
            return text, pairs
    raise NotImplementedError(f"torch.distributed: a process group of backend {str(backend)!r} is not simulated "
                              "(NCCL's is, and gloo's collectives of host tensors)")


def _made(dev: Any, gid: int, backends: tuple[str, dict[str, str]]) -> None:
    """The calling process's group ``gid`` has ``backends``. With gloo's among them, the run offers no replay on a
    GPU: there the run's group is NCCL's alone, made before the program (``reference.cuda_plain``), which takes the
    program's ``init_process_group`` for it."""
    dev.group_backends[(dev.runtime.current().process, gid)] = backends
    if "gloo" in backends[1].values():
        dev.runtime.gpu_replay = False


def _backends(gid: int) -> tuple[str, dict[str, str]]:
    """The calling process's group ``gid``'s backends (:func:`_backends_of`)."""
    dev = session_device()
    return dev.group_backends.get((dev.runtime.current().process, gid), _NCCL)


def _via_gloo(gid: int, tensor: torch.Tensor, name: str, async_op: bool = False) -> bool:
    """Whether group ``gid`` runs a collective of ``tensor`` on its gloo backend (a host tensor, in a group whose
    backend for the CPU is gloo: ``init_process_group("gloo")``, ``new_group(backend="gloo")``,
    ``"cpu:gloo,cuda:nccl"``); False where NCCL's runs it, or none does (NCCL's checks then refuse a host tensor as
    ProcessGroupNCCL does). A device tensor on gloo, and gloo's asynchronous work, are refused (no verdict)."""
    device = "cuda" if isinstance(tensor, torch.Tensor) and tensor.is_cuda else "cpu"
    if _backends(gid)[1].get(device) != "gloo":
        return False
    if device == "cuda":
        raise NotImplementedError(f"torch.distributed.{name} of a device tensor on a gloo process group is not "
                                  "simulated (of host tensors it is; NCCL's of device tensors)")
    if async_op:
        raise NotImplementedError(f"torch.distributed.{name}(async_op=True) on a gloo process group is not simulated "
                                  "(its work runs on gloo's own threads; without async_op it is)")
    return True


def _gloo_exchange(gid: int, name: str, sending: list[torch.Tensor] | None, meta: Any = None) -> list[Any]:
    """A collective of gloo on host tensors: one host step, in which this rank's ``sending`` tensors (None: it sends
    nothing) are read (pinned memory checked as the host's read, a copy of each made, as gloo reads them while the
    caller waits); then the host blocks until every rank of the group has given its part, and is ordered after all
    of them. Nothing runs on a stream. What each rank gave, in group-rank order: its copies and its ``meta``."""
    rt = session_device().runtime
    kind, src = f"{name} (gloo)", user_source()

    def sent() -> tuple[list[torch.Tensor] | None, Any]:
        if sending is None:
            return None, meta
        for t in sending:
            rt.unseen_host_read(t, kind, src)
        with torch._C._DisableTorchDispatch():  # (gloo's copy, no operation of the program's)
            return [t.detach().clone() for t in sending], meta

    return rt.host_collective(sent, kind, gid)


def _gloo_write(name: str, out: torch.Tensor, value: torch.Tensor) -> None:
    """Gloo writes ``value`` into host tensor ``out`` (pinned memory checked as the host's write)."""
    session_device().runtime.unseen_host_access(out, [], [out], f"{name} (gloo)", user_source())
    with torch._C._DisableTorchDispatch():
        out.detach().copy_(value.reshape(out.shape))


def _gloo_refused(gid: int, tensors: list[torch.Tensor], name: str) -> None:
    """A call the simulated gloo backend does not run, of host tensors in a group whose CPU backend is gloo."""
    if any(isinstance(t, torch.Tensor) and not t.is_cuda for t in tensors) and _backends(gid)[1].get("cpu") == "gloo":
        raise NotImplementedError(f"torch.distributed.{name} of host tensors on a gloo process group is not simulated "
                                  "(its all_reduce, broadcast, reduce, all_gather, all_gather_into_tensor, "
                                  "reduce_scatter_tensor, gather, scatter, all_to_all_single and barrier are)")


def _gloo_op(op: Any) -> Any:
    """ProcessGroupGloo's refusal of the reductions it lacks."""
    if op == dist.ReduceOp.AVG:
        raise RuntimeError("Cannot use ReduceOp.AVG with Gloo")
    return op


def _gloo_reduced(gid: int, name: str, tensor: torch.Tensor, op: Any) -> torch.Tensor:
    """Every rank's ``tensor`` reduced, as one run of elements."""
    _gloo_op(op)
    return _reduce(op, [got[0][0] for got in _gloo_exchange(gid, name, [tensor])])


def _gloo_gathered(gid: int, name: str, tensor: torch.Tensor, outputs: list[torch.Tensor]) -> None:
    """``all_gather`` (``outputs``, one per rank) and ``all_gather_into_tensor`` (one output for all) on gloo."""
    sent = [got[0][0] for got in _gloo_exchange(gid, name, [tensor])]
    if len(outputs) == 1 and len(sent) > 1:
        flat = torch.cat([t.reshape(-1) for t in sent])
        if outputs[0].numel() != flat.numel():
            raise ValueError("output tensor size must be equal to world_size times input tensor size")
        _gloo_write(name, outputs[0], flat)
        return
    for out, got in zip(outputs, sent, strict=True):
        _gloo_write(name, out, got)


#: ``init_process_group``'s parameters after ``backend``, in torch's order
_INIT_POSITIONAL = ("init_method", "timeout", "world_size", "rank", "store", "group_name")


def _asked(given: dict[str, Any], key: str, variable: str) -> int:
    """The ``world_size`` or ``rank`` (``key``) an ``init_process_group`` call gives (``given``: its arguments by
    name), or, with -1 or none, the environment's (``variable``), as the ``env://`` rendezvous reads it; -1 where
    neither says."""
    value = given.get(key)
    if value is None or int(value) < 0:
        value = os.environ.get(variable, "-1")
    try:
        return int(value)
    except ValueError:
        return -1


class _Rendezvous:
    """Processes the program started (``multiprocessing.Process``) meeting in ``init_process_group`` to make one
    process group of ``size``: each waits at a barrier of ``size`` parties; the last to arrive makes the world of
    them, in the order of their ranks, and each leaves ordered after every other's arrival (as a rendezvous through
    a store orders them)."""

    def __init__(self, size: int) -> None:
        from simdevice.dropin.processes import SimBarrier

        self.size = size
        self.members: dict[int, Any] = {}
        self.barrier = SimBarrier(size, action=self._made)

    def _made(self) -> None:
        world = session_device().runtime.collectives.new_world([self.members[r] for r in range(self.size)])
        world.launched = False  # (their environment is their own: no launcher set torchrun's variables in it)


def _rendezvous(dev: Any, size: int, rank: int, given: dict[str, Any]) -> None:
    """The calling process joins the world of ``size`` its ``init_process_group`` asks for, as rank ``rank``, waiting
    for the others (:class:`_Rendezvous`; one per ``init_method``, or per master's address and port)."""
    a = dev.runtime.current()
    if a.process != a.name:
        raise NotImplementedError("torch.distributed: init_process_group of a world of several from a thread is not "
                                  "simulated")
    if not 0 <= rank < size:
        raise ValueError(f"init_process_group: rank {rank} of a world of {size}: give each process its rank "
                         "(rank=, or RANK in its environment)")
    where = given.get("init_method") or (f"env://{os.environ.get('MASTER_ADDR', '')}:"
                                         f"{os.environ.get('MASTER_PORT', '')}")
    if given.get("store") is not None:
        where = f"store {id(given['store'])}"
    meeting = dev.rendezvous.get(where)
    if meeting is None:
        meeting = dev.rendezvous[where] = _Rendezvous(size)
    if meeting.size != size:
        raise RuntimeError(f"init_process_group at {where}: a world of {size} asked where one of {meeting.size} is "
                           "being made")
    if rank in meeting.members:
        raise RuntimeError(f"init_process_group at {where}: rank {rank} joined twice")
    meeting.members[rank] = a
    meeting.barrier.wait()


def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> None:
    """The calling rank's default process group again (it has one from its start). A process the program started
    itself (``multiprocessing.Process``) that asks for a world of several (``world_size=``, or ``WORLD_SIZE``) joins
    the world its peers make by the same call: a rendezvous, after which their collectives are one group's."""
    backends = _backends_of(backend)
    dev = session_device()
    given = {**dict(zip(_INIT_POSITIONAL, args, strict=False)), **kwargs}
    size = _asked(given, "world_size", "WORLD_SIZE")
    if dev.runtime.rank_in_world() is None and size > 1:
        _rendezvous(dev, size, _asked(given, "rank", "RANK"), given)
    dev.groups_destroyed.discard(dev.runtime.current().process)
    _made(dev, 0, backends)


def destroy_process_group(group: Any = None) -> None:
    """The default group (None, or the group ``dist.group.WORLD`` names) and with it every group ``new_group`` made,
    as torch destroys them all; or the one group given, alone (again: torch's ``Invalid process group specified``)."""
    if _non_member(group):  # (as torch's: nothing to destroy on a rank outside the group)
        return
    dev = session_device()
    process = dev.runtime.current().process
    if isinstance(group, _Group) and group.gid != 0:
        if not is_initialized() or (process, group.gid) in dev.subgroups_destroyed:
            raise ValueError("Invalid process group specified")
        dev.subgroups_destroyed.add((process, group.gid))
        return
    _check_group(group)
    dev.groups_destroyed.add(process)
    dev.subgroups_destroyed.update((process, gid) for gid in range(1, dev.groups_made.get(process, 0) + 1))


def get_rank(group: Any = None) -> int:
    """The rank's rank in ``group`` (its index among the members; the world's by default), -1 outside it (torch's
    answer for ``GroupMember.NON_GROUP_MEMBER``)."""
    if _non_member(group):
        return -1
    _initialized()
    if isinstance(group, _Group) and group.members is not None:
        return group.members.index(session_device().rank)
    return session_device().rank


def get_world_size(group: Any = None) -> int:
    """``group``'s size (its members'; the world's by default), -1 outside it (torch's answer for
    ``GroupMember.NON_GROUP_MEMBER``)."""
    if _non_member(group):
        return -1
    _initialized()
    if isinstance(group, _Group) and group.members is not None:
        return len(group.members)
    return session_device().world_size


def _not_registered(group: Any) -> ValueError:
    """torch's error where a group it does not know is asked about (``GroupMember.NON_GROUP_MEMBER`` among them)."""
    return ValueError(f"Group {group} is not registered, please create group with torch.distributed.new_group API")


def get_group_rank(group: Any, global_rank: int) -> int:
    """``global_rank``'s rank in ``group`` (the same in a group of every rank), as torch's: ValueError where it is
    not a member."""
    if _non_member(group):
        raise _not_registered(group)
    if not isinstance(group, _Group) or group.members is None:
        return global_rank
    if global_rank not in group.members:
        raise ValueError(f"Global rank {global_rank} is not part of group {group}")
    return group.members.index(global_rank)


def get_global_rank(group: Any, group_rank: int) -> int:
    """The global rank of ``group``'s rank ``group_rank`` (the same in a group of every rank), as torch's:
    ValueError where the group has no such rank."""
    if _non_member(group):
        raise _not_registered(group)
    if not isinstance(group, _Group) or group.members is None:
        return group_rank
    if not 0 <= group_rank < len(group.members):
        raise ValueError(f"Group rank {group_rank} is not part of group {group}")
    return group.members[group_rank]


def get_process_group_ranks(group: Any = None) -> list[int]:
    """``group``'s members, global ranks in group-rank order (torch's KeyError for
    ``GroupMember.NON_GROUP_MEMBER``, which its registry does not hold)."""
    if _non_member(group):
        raise KeyError(group)
    if isinstance(group, _Group) and group.members is not None:
        return list(group.members)
    return list(range(get_world_size()))


def get_backend(group: Any = None) -> str:
    if _non_member(group):
        raise ValueError("Invalid process group specified")
    return _backends(_check_group(group))[0]


def new_group(ranks: Any = None, timeout: Any = None, backend: Any = None, pg_options: Any = None,
              use_local_synchronization: bool = False, group_desc: Any = None, device_id: Any = None,
              sort_ranks: bool = True) -> Any:
    """A new process group (of ``backend``; none given: the default group's): the rank's next group
    (:class:`_Group`), of every rank or of ``ranks`` (sorted, unless ``sort_ranks=False``: a member's rank in it is
    its index there), with torch's checks of ``ranks``. Every
    rank must call it for every group, member or not, with the same ranks, in one order (torch requires it; a rank
    that names other ranks is told so, :meth:`World.new_group`); a rank outside ``ranks`` gets
    ``GroupMember.NON_GROUP_MEMBER``, as from torch. ``use_local_synchronization=True`` for a group of some ranks
    (called by its members alone) is not simulated: the simulator matches groups by the order every rank makes
    them."""
    backends = _backends(0) if backend is None else _backends_of(backend)  # (none: the default group's, as torch's)
    dev = session_device()
    w, me = dev.world_size, dev.rank
    if ranks is None:
        members = tuple(range(w))
    else:
        listed = sorted(ranks) if sort_ranks else list(ranks)
        if len(set(listed)) != len(listed):
            raise ValueError(f"ranks list must not contain duplicate entries, got {listed}")
        if len(listed) > w:
            raise ValueError("the new group's world size should be less or equal to the world size set by "
                             "init_process_group")
        for r in listed:
            if r < 0 or r >= w:
                raise ValueError(f"Rank {r} is out of range. Valid ranks are 0 to {w - 1} (world_size={w})")
        members = tuple(listed)
    whole = members == tuple(range(w))
    if use_local_synchronization and not whole:
        raise NotImplementedError("torch.distributed.new_group(use_local_synchronization=True) of some ranks is not "
                                  "simulated (every rank calling new_group for every group, in one order, is)")
    process = dev.runtime.current().process
    dev.groups_made[process] = dev.groups_made.get(process, 0) + 1
    gid = dev.groups_made[process]
    dev.runtime.new_group(gid, members)
    _made(dev, gid, backends)
    if me not in members:
        return NON_GROUP_MEMBER
    group = _Group(gid, None if whole else members)
    dev.groups_named[(process, group.group_name)] = group
    return group


def _world_group(cls: Any) -> Any:
    """``dist.group.WORLD`` (``GroupMember.WORLD``): in a rank of a run, its default group (:data:`WORLD`) while it
    has one, as torch's names the default process group once made; outside a run, torch's own."""
    if not in_actor():
        return dist.distributed_c10d._world.default_pg
    return WORLD if is_initialized() else None


def _resolve_process_group(group_name: str) -> _Group:
    """``distributed_c10d._resolve_process_group``: the calling rank's group of that name (torch's C++ registry)."""
    _initialized()
    if group_name == WORLD.group_name:
        return WORLD
    dev = session_device()
    group = dev.groups_named.get((dev.runtime.current().process, group_name))
    if group is None:
        raise ValueError(f"Could not resolve the process group registered under the name {group_name}")
    return group  # type: ignore[no-any-return]


#: torch's names of the one-tensor all-gather and reduce-scatter, as its warnings give them: torch 2.13 calls them
#: ``all_gather_single`` and ``reduce_scatter_single`` (``all_gather_into_tensor`` and ``reduce_scatter_tensor``,
#: deprecated there, call those); an older torch has the older names alone
_ALL_GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
_REDUCE_SCATTER = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"


def all_gather_into_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None,
                           async_op: bool = False) -> Any:  # (a SimWork, torch's _IllegalWork, or None)
    _torch_checks_tensor(input_tensor, "input_tensor")
    _torch_checks_tensor(output_tensor, "output_tensor")
    if _outside(group, _ALL_GATHER):
        return None
    gid = _check_group(group)
    if _via_gloo(gid, input_tensor, _ALL_GATHER, async_op):
        _same_dtype(output_tensor, input_tensor)
        _gloo_gathered(gid, _ALL_GATHER, input_tensor, [output_tensor])
        return None
    _check_pair(output_tensor, input_tensor, get_world_size(group), 1, "output tensor must have the same type as input "
                "tensor", "output tensor size must be equal to world_size times input tensor size")
    # (as the device's ``all_gather_into_tensor``, in the group named)
    out, inp = output_tensor.view(-1), in_memory_order(input_tensor)
    source = user_source()

    def issue(redop: Any) -> Any:
        return session_device().runtime.all_gather(ref_of(out), ref_of(inp), source, gid)

    return _launched(group, gid, _ALL_GATHER, None, issue, async_op, output_tensor, input_tensor)


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None,
               async_op: bool = False) -> SimWork | None:
    if _non_member(group):  # (torch's checks before its own)
        _torch_checks_list(tensor_list, "tensor_list")
        _torch_checks_tensor(tensor, "tensor")
        _same_dtype(tensor_list, tensor)
    if _outside(group, "all_gather"):
        return None
    gid = _check_group(group)
    if _via_gloo(gid, tensor, "all_gather", async_op):
        _torch_checks_list(tensor_list, "tensor_list")
        _same_dtype(tensor_list, tensor)
        if len(tensor_list) != get_world_size(group):
            raise RuntimeError(f"ProcessGroupGloo::allgather: invalid output tensor list: {len(tensor_list)} tensors, "
                               f"one per rank ({get_world_size(group)}) expected")
        _gloo_gathered(gid, "all_gather", tensor, tensor_list)
        return None
    _check_tensor(tensor)
    if len(tensor_list) != get_world_size(group):
        raise ValueError(f"all_gather: tensor_list holds {len(tensor_list)} tensors, one per rank "
                         f"({get_world_size(group)}) expected (NCCL would write past the ones given)")
    rt = session_device().runtime
    gather = rt.collective("all_gather", [ref_of(t) for t in tensor_list], [ref_of(tensor)],
                           lambda rank, sent: sent, user_source(), group=gid)
    return _finish(gather, async_op, *tensor_list, tensor, outputs=len(tensor_list))


def all_reduce(tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None,
               async_op: bool = False) -> Any:
    _torch_checks_tensor(tensor, "tensor")
    if _outside(group, "all_reduce"):
        return None
    gid = _check_group(group)
    if _via_gloo(gid, tensor, "all_reduce", async_op):
        _gloo_write("all_reduce", tensor, _gloo_reduced(gid, "all_reduce", tensor, op))
        return None
    _check_tensor(tensor)
    _check_nccl_op(op, tensor)
    rt = session_device().runtime
    ref = ref_of(tensor)
    source = user_source()

    def issue(redop: Any) -> Any:
        return rt.collective("all_reduce", [ref], [ref], lambda rank, sent: [_reduce(redop, sent)], source, group=gid)

    return _launched(group, gid, "all_reduce", op, issue, async_op, tensor)


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op: Any = dist.ReduceOp.SUM,
                          group: Any = None, async_op: bool = False) -> Any:
    _torch_checks_tensor(output, "output")
    _torch_checks_tensor(input, "input")
    if _outside(group, _REDUCE_SCATTER):
        return None
    gid = _check_group(group)
    if _via_gloo(gid, input, _REDUCE_SCATTER, async_op):
        _same_dtype(output, input)
        if input.numel() != output.numel() * get_world_size(group):
            raise ValueError("input tensor must be the same size as output size times world size")
        n, me = output.numel(), get_rank(group)
        _gloo_write(_REDUCE_SCATTER, output, _gloo_reduced(gid, _REDUCE_SCATTER, input, op)[me * n:(me + 1) * n])
        return None
    _check_pair(output, input, 1, get_world_size(group), "input tensor must be the same type as the output tensor.",
                "input tensor must be the same size as output size times world size")
    _check_nccl_op(op, input)
    rt = session_device().runtime
    n = output.numel()
    source = user_source()

    def issue(redop: Any) -> Any:
        def shard(rank: int, sent: list[torch.Tensor]) -> list[torch.Tensor]:
            return [_reduce(redop, sent)[rank * n:(rank + 1) * n]]

        return rt.collective("reduce_scatter", [ref_of(output)], [ref_of(input)], shard, source, group=gid)

    return _launched(group, gid, _REDUCE_SCATTER, op, issue, async_op, output, input)


#: torch 2.13's names for the two (the same parameters)
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor


def _root(src: int | None, group_src: int | None, group: Any = None) -> int:
    """The root rank in ``group``, given as a global rank or as a rank of the group (the same in a group of every
    rank), as torch takes it (``_canonicalize_group_rank``): one of the two, not both; a global rank outside the
    group raises as torch's ``get_group_rank`` does (and any, on ``GroupMember.NON_GROUP_MEMBER``)."""
    if src is not None and group_src is not None:
        raise ValueError("Can't specify both group_rank and global_rank")
    if src is None and group_src is None:
        raise ValueError("Must specify global_rank or group_rank")
    return get_group_rank(group, src) if src is not None else group_src  # type: ignore[return-value]


def _torch_checks_tensor(t: Any, name: str) -> None:
    """torch's own check of a tensor argument (``_check_single_tensor``): a tensor, else TypeError."""
    dist.distributed_c10d._check_single_tensor(t, name)


def broadcast(tensor: torch.Tensor, src: int | None = None, group: Any = None, async_op: bool = False,
              group_src: int | None = None) -> SimWork | None:
    if _non_member(group):  # (torch's order: the root first, then the tensor)
        _root(src, group_src, group)
        _torch_checks_tensor(tensor, "tensor")
    if _outside(group, "broadcast"):
        return None
    gid = _check_group(group)
    src = _root(src, group_src, group)
    if _via_gloo(gid, tensor, "broadcast", async_op):
        root = get_rank(group) == src
        sent = _gloo_exchange(gid, "broadcast", [tensor] if root else None)
        if not root:
            _gloo_write("broadcast", tensor, sent[src][0][0])
        return None
    _check_tensor(tensor)
    rt = session_device().runtime
    ref = ref_of(tensor)
    # NCCL's in-place broadcast: the root only sends from its buffer, the others only receive into theirs
    if get_rank(group) == src:
        gather = rt.collective("broadcast", [], [ref], lambda rank, sent: [], user_source(), group=gid)
    else:
        gather = rt.collective("broadcast", [ref], [], lambda rank, sent: [sent[src]], user_source(), group=gid)
    return _finish(gather, async_op, tensor)


def reduce(tensor: torch.Tensor, dst: int | None = None, op: Any = dist.ReduceOp.SUM, group: Any = None,
           async_op: bool = False, group_dst: int | None = None) -> SimWork | None:
    if _non_member(group):  # (torch's order: the root first, then the tensor)
        _root(dst, group_dst, group)
        _torch_checks_tensor(tensor, "tensor")
    if _outside(group, "reduce"):
        return None
    gid = _check_group(group)
    dst = _root(dst, group_dst, group)
    if _via_gloo(gid, tensor, "reduce", async_op):
        reduced = _gloo_reduced(gid, "reduce", tensor, op)
        if get_rank(group) == dst:
            _gloo_write("reduce", tensor, reduced)
        return None
    _check_tensor(tensor)
    _check_nccl_op(op, tensor)
    rt = session_device().runtime
    ref = ref_of(tensor)
    # every rank sends its tensor; only ``dst``'s is written (NCCL's in-place reduce)
    outs = [ref] if get_rank(group) == dst else []
    gather = rt.collective("reduce", outs, [ref], lambda rank, sent: [_reduce(op, sent)] if rank == dst else [],
                           user_source(), group=gid)
    return _finish(gather, async_op, tensor)


def _root_or_zero(root: int | None, group_root: int | None, group: Any = None) -> int:
    """:func:`_root`, where neither is given global rank 0: torch's default for ``gather``, ``scatter`` and their
    object forms."""
    return _root(0 if root is None and group_root is None else root, group_root, group)


def _rooted_arguments(tensor: torch.Tensor, tensors: list[torch.Tensor] | None, name: str, group: Any,
                      root: int | None, group_root: int | None) -> tuple[list[torch.Tensor], int, int] | None:
    """torch's first checks of ``gather``'s and ``scatter``'s arguments, in its order: the tensor, the root's list
    (a list only where one is given: None and [] alike elsewhere), their dtypes, the group; the list (or []), the
    root rank in the group (rank 0 where none is given) and the group's id (:func:`_check_group`). None on
    ``GroupMember.NON_GROUP_MEMBER``, where torch warns and runs nothing (``scatter`` after it took the root, which
    raises there if given as a global rank, ``gather`` before)."""
    dist.distributed_c10d._check_single_tensor(tensor, "tensor")
    if tensors:
        _torch_checks_list(tensors, name)
    else:
        tensors = []
    _same_dtype(tensor, tensors)
    op = name.removesuffix("_list")
    if op == "scatter" and _non_member(group):
        _root_or_zero(root, group_root, group)
    if _outside(group, op, stacklevel=4):
        return None
    gid = _check_group(group)
    return tensors, _root_or_zero(root, group_root, group), gid


def _root_in_world(name: str, root: int, group: Any = None) -> None:
    """ProcessGroupNCCL's check of a rooted collective's root (``assertRootRank``): a rank of the group."""
    if not 0 <= root < get_world_size(group):
        raise ValueError(f"ProcessGroupNCCL::{name}: invalid root rank: {root}")


def _shape(sizes: Any) -> str:
    """A tensor's sizes as c10d's messages print them (``toString``): ``(2, 3)``."""
    return f"({', '.join(str(n) for n in sizes)})"


def _rooted_list(name: str, tensors: list[torch.Tensor], like: torch.Tensor, which: str, group: Any) -> None:
    """ProcessGroupNCCL's checks of the root's list in ``gather`` (``which``: output) and ``scatter`` (input): one
    tensor per rank of the group, each of ``like``'s sizes (``assertTypeAndSizesMatch``; torch checked the dtypes
    already)."""
    w = get_world_size(group)
    if len(tensors) != w:
        raise ValueError(f"ProcessGroupNCCL::{name}: Incorrect {which} list size {len(tensors)}. {which.capitalize()} "
                         f"list size should be {w}, same as size of the process group.")
    for i, t in enumerate(tensors):
        if t.shape != like.shape:
            raise ValueError(f"ProcessGroupNCCL::{name}: invalid tensor size at index {i} (expected "
                             f"{_shape(like.shape)}, got {_shape(t.shape)})")


def gather(tensor: torch.Tensor, gather_list: list[torch.Tensor] | None = None, dst: int | None = None,
           group: Any = None, async_op: bool = False, group_dst: int | None = None) -> SimWork | None:
    """As ProcessGroupNCCL's ``gather``: on the rank's ``nccl`` stream, every rank sends ``tensor`` to ``dst``, whose
    receive writes rank r's into ``gather_list[r]``; the other ranks write nothing. ``gather_list`` is given on
    ``dst`` alone (None or empty elsewhere), one tensor per rank of the input's sizes and dtype, as torch and
    ProcessGroupNCCL check, with their messages. (``dst``'s own piece is a copy ProcessGroupNCCL issues on the
    calling stream; here it lands with the others on ``nccl``, so a read of that piece alone before the work's
    ``wait()`` is reported where a GPU orders it: a possible false race, never a missed one.)"""
    checked = _rooted_arguments(tensor, gather_list, "gather_list", group, dst, group_dst)
    if checked is None:
        return None
    gather_list, dst, gid = checked
    dist.distributed_c10d._validate_output_list_for_rank(get_rank(group), dst, gather_list)
    if _via_gloo(gid, tensor, "gather", async_op):
        sent = [got[0][0] for got in _gloo_exchange(gid, "gather", [tensor])]
        if get_rank(group) == dst:
            if len(gather_list) != len(sent):
                raise RuntimeError(f"ProcessGroupGloo::gather: Incorrect output list size {len(gather_list)}. "
                                   f"Output list size should be {len(sent)}, same as size of the process group.")
            for out, got in zip(gather_list, sent, strict=True):
                _gloo_write("gather", out, got)
        return None
    _root_in_world("gather", dst, group)
    if get_rank(group) == dst:
        _rooted_list("gather", gather_list, tensor, "output", group)
    for t in [tensor, *gather_list]:
        _check_tensor(t)
    rt = session_device().runtime
    outs = [ref_of(t) for t in gather_list]
    issued = rt.collective("gather", outs, [ref_of(tensor)], lambda rank, sent: sent if rank == dst else [],
                           user_source(), group=gid)
    return _finish(issued, async_op, *gather_list, tensor, outputs=len(gather_list))


def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None = None, src: int | None = None,
            group: Any = None, async_op: bool = False, group_src: int | None = None) -> SimWork | None:
    """As ProcessGroupNCCL's ``scatter``: on the rank's ``nccl`` stream, ``src`` sends ``scatter_list[r]`` to rank
    r (one NCCL group of a send to each rank), and each rank's receive writes its piece into ``tensor``.
    ``scatter_list`` is given on ``src`` alone (None or empty elsewhere), one tensor per rank of the output's sizes
    and dtype there, as torch and ProcessGroupNCCL check, with their messages; a rank whose ``tensor`` is not the
    size of its piece is told so at the exchange, naming both sides (on a GPU: the wrong bytes, or a hang).
    (``src``'s own piece is a copy ProcessGroupNCCL issues on the calling stream; here it runs on ``nccl`` with the
    others: a possible false race on that piece, never a missed one.)"""
    checked = _rooted_arguments(tensor, scatter_list, "scatter_list", group, src, group_src)
    if checked is None:
        return None
    scatter_list, src, gid = checked
    rank, w = get_rank(group), get_world_size(group)
    if rank == src and not scatter_list:
        raise ValueError("Argument ``scatter_list`` must be specified on source rank.")
    if rank != src and scatter_list:
        raise ValueError("Argument ``scatter_list`` must NOT be specified on non-source ranks.")
    if _via_gloo(gid, tensor, "scatter", async_op):
        if rank == src and len(scatter_list) != w:
            raise RuntimeError(f"ProcessGroupGloo::scatter: Incorrect input list size {len(scatter_list)}. Input "
                               f"list size should be {w}, same as size of the process group.")
        sent = _gloo_exchange(gid, "scatter", scatter_list if rank == src else None)
        _gloo_write("scatter", tensor, sent[src][0][rank])
        return None
    _root_in_world("scatter", src, group)
    if rank == src:
        _rooted_list("scatter", scatter_list, tensor, "input", group)
    for t in [tensor, *scatter_list]:
        _check_tensor(t)
    # what each rank exchanges: ``src`` sends each rank its piece, each rank receives its own from ``src`` alone
    receives = tuple(tensor.numel() if q == src else 0 for q in range(w))
    sends = tuple(t.numel() for t in scatter_list) if rank == src else (0,) * w
    rt = session_device().runtime
    issued = rt.collective("scatter", [ref_of(tensor)], [ref_of(t) for t in scatter_list],
                           lambda rank, sent: [sent[src]], user_source(), Splits(sends, receives), gid)
    return _finish(issued, async_op, tensor, *scatter_list)


def _torch_checks_list(tensors: Any, name: str) -> None:
    """torch's own check of a list argument (``_check_tensor_list``): a list of tensors, else TypeError."""
    dist.distributed_c10d._check_tensor_list(tensors, name)


def _same_dtype(*tensors: torch.Tensor) -> None:
    """torch's own check that a collective's tensors share one dtype (``_ensure_all_tensors_same_dtype``)."""
    dist.distributed_c10d._ensure_all_tensors_same_dtype(*tensors)


def _joined(rank: int, sent: list[torch.Tensor]) -> list[torch.Tensor]:
    """An all-to-all's one output: the pieces the ranks sent this one, in rank order."""
    return [torch.cat([t.reshape(-1) for t in sent])]


def _split_lengths(split_sizes: list[int], t: torch.Tensor, w: int) -> tuple[int, ...]:
    """The elements of ``t`` for each rank, as c10d's ``checkSplitSizes`` checks the splits and
    ``computeLengthsAndOffsets`` reads them: rows of dim 0 (none given: ``size(0) / w`` each)."""
    rows = t.size(0)
    if not split_sizes:
        if rows % w:
            raise RuntimeError("Tensor's dim 0 does not divide equally across group size")
        split_sizes = [rows // w] * w
    elif len(split_sizes) != w:
        raise RuntimeError("Number of tensor splits not equal to group size")
    elif sum(split_sizes) != rows:
        raise RuntimeError("Split sizes doesn't match total dim 0 size")
    row = t.numel() // rows if rows else 1
    return tuple(row * int(n) for n in split_sizes)


def all_to_all_single(output: torch.Tensor, input: torch.Tensor, output_split_sizes: Any = None,
                      input_split_sizes: Any = None, group: Any = None, async_op: bool = False) -> SimWork | None:
    """As ProcessGroupNCCL's ``alltoall_base``: on the rank's ``nccl`` stream, one NCCL group of a send to and a
    receive from every rank (none of 0 elements). Without split sizes each rank gets an equal share of dim 0; with
    them, ``input_split_sizes[r]`` rows of the input (in order) go to rank r and ``output_split_sizes[r]`` rows of
    the output come from it, one list given and the other not meaning equal shares on that side. Rank j's
    ``input_split_sizes[r]`` must be rank r's ``output_split_sizes[j]``: where they differ the run raises, naming
    both (NCCL would take the wrong bytes, or wait for bytes that never come)."""
    if _outside(group, "all_to_all_single"):
        return None
    gid = _check_group(group)
    gloo = _via_gloo(gid, input, "all_to_all_single", async_op)
    if not gloo:
        _check_tensor(output)
        _check_tensor(input)
    _same_dtype(output, input)
    w = get_world_size(group)
    out_splits = [] if output_split_sizes is None else list(output_split_sizes)
    in_splits = [] if input_split_sizes is None else list(input_split_sizes)
    if not out_splits and not in_splits:
        if input.numel() % w or output.numel() != input.numel():
            raise ValueError(
                f"all_to_all_single: input of {input.numel()} and output of {output.numel()} elements "
                f"do not split equally over {w} ranks"
            )
        n = input.numel() // w
        splits = Splits((n,) * w, (n,) * w)
    else:
        splits = Splits(_split_lengths(in_splits, input, w), _split_lengths(out_splits, output, w))
    if gloo:
        sent = _gloo_exchange(gid, "all_to_all_single", [input], splits.sends)
        me = get_rank(group)
        got = [copies[0].reshape(-1).split(list(sends))[me] for copies, sends in sent]
        for q, (x, n) in enumerate(zip(got, splits.receives, strict=True)):
            if x.numel() != n:
                raise RuntimeError(f"all_to_all_single: rank {q} sent {x.numel()} elements to rank {me}, which "
                                   f"expected {n} from it")
        _gloo_write("all_to_all_single", output, torch.cat(got))
        return None
    rt = session_device().runtime
    gather = rt.collective("all_to_all", [ref_of(output)], [ref_of(input)], _joined, user_source(), splits, gid)
    return _finish(gather, async_op, output, input)


def all_to_all(output_tensor_list: list[torch.Tensor], input_tensor_list: list[torch.Tensor], group: Any = None,
               async_op: bool = False) -> SimWork | None:
    """As ProcessGroupNCCL's ``alltoall``: on the rank's ``nccl`` stream, one NCCL group of a send of
    ``input_tensor_list[r]`` to rank r and a receive from it into ``output_tensor_list[r]``, for every rank (none of
    0 elements); the tensors may differ in size, rank j's ``input_tensor_list[r]`` being the size of rank r's
    ``output_tensor_list[j]`` (where not, the run raises, naming both)."""
    if _outside(group, "all_to_all"):
        return None
    gid = _check_group(group)
    _torch_checks_list(output_tensor_list, "output_tensor_list")
    _torch_checks_list(input_tensor_list, "input_tensor_list")
    _gloo_refused(gid, input_tensor_list, "all_to_all")
    _same_dtype(output_tensor_list, input_tensor_list)
    for t in [*output_tensor_list, *input_tensor_list]:
        _check_tensor(t)
    w = get_world_size(group)
    for tensors, name in ((output_tensor_list, "output_tensor_list"), (input_tensor_list, "input_tensor_list")):
        if len(tensors) != w:
            raise ValueError(f"all_to_all: {name} holds {len(tensors)} tensors, one per rank ({w}) expected (NCCL "
                             "would send to or receive from the ranks given alone)")
    splits = Splits(tuple(t.numel() for t in input_tensor_list), tuple(t.numel() for t in output_tensor_list))
    rt = session_device().runtime
    gather = rt.collective("all_to_all", [ref_of(t) for t in output_tensor_list],
                           [ref_of(t) for t in input_tensor_list], lambda rank, sent: sent, user_source(), splits, gid)
    return _finish(gather, async_op, *output_tensor_list, *input_tensor_list, outputs=len(output_tensor_list))


def reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor], op: Any = dist.ReduceOp.SUM,
                   group: Any = None, async_op: bool = False) -> SimWork | None:
    """As ProcessGroupNCCL's ``reduce_scatter``: on the rank's ``nccl`` stream, every tensor of ``input_list`` read
    (tensors of one shape are copied there into one buffer for ``ncclReduceScatter``; of different shapes, each is
    reduced to its rank in one NCCL group), and ``output`` written with the reduction of every rank's
    ``input_list[rank]``."""
    if _non_member(group):  # (torch's checks before its own)
        _torch_checks_tensor(output, "output")
        _torch_checks_list(input_list, "input_list")
        _same_dtype(output, input_list)
    if _outside(group, "reduce_scatter"):
        return None
    gid = _check_group(group)
    _torch_checks_list(input_list, "input_list")
    _same_dtype(output, input_list)
    _gloo_refused(gid, [output], "reduce_scatter")
    _check_tensor(output)
    for t in input_list:
        _check_tensor(t)
    _check_nccl_op(op, output)
    w = get_world_size(group)
    if all(t.shape == input_list[0].shape for t in input_list):  # ProcessGroupNCCL's ``check_same_size``
        if len(input_list) != w:  # (its ``flatten_for_scatter_gather``)
            raise ValueError("Tensor list input to scatter/gather must match number of collective participants but "
                             f"got {len(input_list)} inputs with world_size {w} and 1 devices.")
        if any(t.numel() != output.numel() for t in input_list):
            raise ValueError("All tensor operands to scatter/gather must have the same number of elements")
    else:  # one ``_reduce_oop`` to each rank
        if len(input_list) != w:
            raise ValueError(f"reduce_scatter: input_list holds {len(input_list)} tensors, one per rank ({w}) "
                             "expected")
        if input_list[get_rank(group)].numel() != output.numel():
            raise ValueError("Tensor input and output of _reduce_oop must have the same number of elements ")
    splits = Splits(tuple(t.numel() for t in input_list), (output.numel(),) * w)
    rt = session_device().runtime
    gather = rt.collective("reduce_scatter", [ref_of(output)], [ref_of(t) for t in input_list],
                           lambda rank, sent: [_reduce(op, sent)], user_source(), splits, gid)
    return _finish(gather, async_op, output, *input_list)


def _peer(peer: int | None, group_peer: int | None, what: str, group: Any = None) -> int:
    """The peer's rank in ``group`` of a point-to-point call, given as a global rank or a rank of the group (the same
    in a group of every rank), as torch takes it (:func:`_root`). A receive from any source (neither given) is what
    ProcessGroupNCCL refuses."""
    if peer is None and group_peer is None and what == "source":
        raise RuntimeError("ProcessGroupNCCL does not support recvAnysource")
    return _root(peer, group_peer, group)


def _point_to_point(ops: list[tuple[int, torch.Tensor, bool]], group: Any, gid: int, batch: bool = False) -> SimWork:
    """Sends and receives (peers as ranks of ``group``) as NCCL runs them (:meth:`Runtime.point_to_point`), in
    process group ``gid``: one call on the stream of its pair of ranks, a batch on the group's collectives' stream;
    the work's ``wait()`` makes the current stream wait for all of them."""
    me = get_rank(group)
    _gloo_refused(gid, [t for _, t, _ in ops], "point-to-point call (send, recv, isend, irecv, batch_isend_irecv)")
    for peer, tensor, is_send in ops:
        _check_tensor(tensor)
        if peer == me and not batch:  # (NCCL matches a send to itself with a receive of its group)
            raise NotImplementedError(f"torch.distributed: a {'send to' if is_send else 'receive from'} the rank "
                                      "itself outside a batch_isend_irecv is not simulated")
    rt = session_device().runtime
    gather = rt.point_to_point([(peer, ref_of(t), is_send) for peer, t, is_send in ops], batch, user_source(), gid)
    return SimWork(session_device(), gather, tuple(t for _, t, _ in ops))


def isend(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0,
          group_dst: int | None = None) -> SimWork | None:
    if _non_member(group):  # (torch's order: the peer, which raises if given as a global rank, then the tensor)
        _peer(dst, group_dst, "destination", group)
        _torch_checks_tensor(tensor, "tensor")
    if _outside(group, "isend"):
        return None
    gid = _check_group(group)
    return _point_to_point([(_peer(dst, group_dst, "destination", group), tensor, True)], group, gid)


def irecv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> SimWork | None:
    if _non_member(group):
        _torch_checks_tensor(tensor, "tensor")
    if _outside(group, "irecv"):
        return None
    gid = _check_group(group)
    return _point_to_point([(_peer(src, group_src, "source", group), tensor, False)], group, gid)


def send(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0,
         group_dst: int | None = None) -> None:
    """As torch's: ``isend`` and ``wait()``: the current stream waits for the send; the host goes on (NCCL's send
    does not block the host; its stream waits for the peer's receive). ``dst`` is a global rank, ``group_dst`` a
    rank of ``group``."""
    if _non_member(group):  # (torch's: a global ``dst`` raises ValueError, a ``group_dst`` its self-rank check)
        dist.distributed_c10d._check_not_self_rank(group, _peer(dst, group_dst, "destination", group), "destination")
    _check_group(group)
    peer = _peer(dst, group_dst, "destination", group)
    if peer == get_rank(group):
        raise ValueError("Invalid destination rank: should not be the same as the rank of the current process.")
    work = isend(tensor, group=group, group_dst=peer)
    assert work is not None
    work.wait()


def recv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0,
         group_src: int | None = None) -> int:
    """As torch's: ``irecv`` and ``wait()``; the source's global rank (``src`` a global rank, ``group_src`` a rank of
    ``group``); -1 on ``GroupMember.NON_GROUP_MEMBER``, where ``irecv`` warned and ran nothing."""
    if _non_member(group):
        _torch_checks_tensor(tensor, "tensor")
        _outside(group, "irecv")
        return -1
    _check_group(group)
    peer = _peer(src, group_src, "source", group)
    if peer == get_rank(group):
        raise ValueError("Invalid source rank: should not be the same as the rank of the current process.")
    work = irecv(tensor, group=group, group_src=peer)
    assert work is not None
    work.wait()
    return get_global_rank(group, peer)


def batch_isend_irecv(p2p_op_list: list[Any]) -> list[SimWork]:
    """The ops as one NCCL group on their process group's collectives' stream (torch's coalescing manager): every send
    and receive of it posted before any waits for its peer; one work for the group, as torch returns. Each op's peer
    is its rank in the group (``P2POp.group_peer``, which ``P2POp`` takes from ``peer``, a global rank, or
    ``group_peer``)."""
    if not isinstance(p2p_op_list, list) or not all(isinstance(p, dist.P2POp) for p in p2p_op_list):
        raise ValueError("Invalid ``p2p_op_list``. Each op is expected to to be of type ``torch.distributed.P2POp``.")
    if not p2p_op_list:
        return []
    if not all(p.group == p2p_op_list[0].group for p in p2p_op_list):  # (torch's ``_check_p2p_op_list``)
        raise ValueError("All ops need to use the same group.")
    ops = []
    gid = 0
    group = p2p_op_list[0].group
    for p in p2p_op_list:
        gid = _check_group(p.group)
        if p.op not in (isend, irecv, dist.isend, dist.irecv):
            raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``torch.distributed.isend`` or "
                             "``torch.distributed.irecv``.")
        peer = getattr(p, "group_peer", None)
        ops.append((get_group_rank(p.group, p.peer) if peer is None else peer, p.tensor,
                    getattr(p.op, "__name__", "") == "isend"))
    return [_point_to_point(ops, group, gid, batch=True)]


def _not_simulated(name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"torch.distributed.{name} is not simulated (simulated: {', '.join(sorted(SIMULATED))})"
        )

    call.__name__ = name
    return call


#: what ``torch.distributed`` offers that the simulated process group does not run: each raises NotImplementedError
#: naming itself (the run then gives no verdict), rather than reaching the real, uninitialized process group
NOT_SIMULATED = (
    "all_gather_coalesced", "all_reduce_coalesced", "monitored_barrier",
    "new_subgroups", "new_subgroups_by_enumeration", "split_group", "shrink_group", "record_comm",
    # C++ functions that take the process group itself (DDP's construction calls them): handed the simulated group,
    # or ``dist.group.WORLD`` (None here), they crash the process
    "_verify_params_across_processes", "_broadcast_coalesced",
)


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None, timeout: Any = None) -> SimWork | None:
    if _outside(group, "barrier"):
        return None
    gid = _check_group(group)
    backends = _backends(gid)[1]
    if backends.get("cpu") == "gloo" and (device_ids is None or backends.get("cuda") != "nccl"):
        # torch's barrier runs on the group's CPU backend where it has one (``_get_object_coll_device``), unless
        # given ``device_ids`` where CUDA's is NCCL: gloo's orders the hosts alone, no stream
        if async_op:
            raise NotImplementedError("torch.distributed.barrier(async_op=True) on a gloo process group is not "
                                      "simulated (without async_op it is)")
        _gloo_exchange(gid, "barrier", None)
        return None
    rt = session_device().runtime
    gather = rt.collective("barrier", [], [], lambda rank, sent: [], user_source(), group=gid)
    if async_op:
        return SimWork(session_device(), gather, barrier=True)  # its wait() blocks the host, as the call does
    rt.work_wait_host(gather)  # NCCL's barrier blocks the host until every rank reached it
    return None


class _Pickled:
    """An object as an object collective sends it: pickled at the call, as torch pickles it into the tensor it
    sends (``_object_to_tensor``), so what the sender changes afterwards does not reach its peers, and each receiver
    (the sender too, for ``all_gather_object``) unpickles a copy of its own. A device tensor in it is copied to the
    host as the sender pickles it (torch's pickling of a CUDA storage: a synchronizing copy on the current stream)
    and back to the device as a receiver unpickles it. An object that does not pickle here (a local function or
    class in it) is shared as it is."""

    def __init__(self, obj: Any) -> None:
        self.payload, refs = pickled(obj, lambda x: isinstance(x, SimTensor))
        self.obj: Any = obj if self.payload is None else None
        self.tensors = [(x.detach().cpu(), x.requires_grad) for x in refs]

    def received(self) -> Any:
        """The receiver's copy, made anew."""
        if self.payload is None:
            return self.obj
        made: dict[int, torch.Tensor] = {}

        def tensor(i: int) -> torch.Tensor:
            if i not in made:
                host, requires_grad = self.tensors[i]
                made[i] = host.to("cuda").requires_grad_(requires_grad)
            return made[i]

        return unpickled(self.payload, tensor)


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    if _outside(group, "all_gather_object"):
        return
    gid = _check_group(group)
    sent = session_device().runtime.exchange_objects(_Pickled(obj), group=gid)
    object_list[:] = [p.received() for p in sent]


#: the root ``broadcast_object_list`` takes where none is given: that of the installed torch (0 before torch 2.6)
_OBJECT_LIST_SRC: int | None = inspect.signature(
    dist.distributed_c10d.broadcast_object_list).parameters["src"].default


def broadcast_object_list(object_list: list[Any], src: int | None = None, group: Any = None, device: Any = None,
                          group_src: int | None = None) -> None:
    if src is None and group_src is None:  # torch before 2.6 took rank 0 for it; later ones refuse (_root)
        src = _OBJECT_LIST_SRC
    if _non_member(group):  # (torch's order: the root, which raises if given as a global rank, then the group)
        _root(src, group_src, group)
    if _outside(group, "broadcast_object_list"):
        return
    gid = _check_group(group)
    src = _root(src, group_src, group)
    root = get_rank(group) == src  # as torch's: the root pickles its objects and keeps its list as it is,
    sent = session_device().runtime.exchange_objects([_Pickled(o) for o in object_list] if root else None,
                                                     "broadcast_object_list", gid)
    if not root:  # the others get copies of the root's objects
        object_list[:] = [p.received() for p in sent[src]]


def gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int | None = None, group: Any = None,
                  group_dst: int | None = None) -> None:
    """As torch's: every rank's object pickled at the call, ``dst`` unpickling each into ``object_gather_list[r]``
    (given on ``dst`` alone, torch's check); the host blocks until every rank has given its object."""
    if _non_member(group):  # (torch's order: the root, which raises if given as a global rank, then the group)
        _root_or_zero(dst, group_dst, group)
    if _outside(group, "gather_object"):
        return
    gid = _check_group(group)
    dst = _root_or_zero(dst, group_dst, group)
    dist.distributed_c10d._validate_output_list_for_rank(get_rank(group), dst, object_gather_list)
    _root_in_world("gather", dst, group)
    sent = session_device().runtime.exchange_objects(_Pickled(obj), "gather_object", gid)
    if object_gather_list is not None and get_rank(group) == dst:
        for i, p in enumerate(sent):  # (as torch fills it: by index, a list too short raises IndexError)
            object_gather_list[i] = p.received()


def scatter_object_list(scatter_object_output_list: list[Any], scatter_object_input_list: list[Any] | None = None,
                        src: int | None = None, group: Any = None, group_src: int | None = None) -> None:
    """As torch's: ``src`` pickles each object of ``scatter_object_input_list`` (one per rank) at the call, and each
    rank unpickles its own into ``scatter_object_output_list[0]``; the host blocks until ``src`` has given them."""
    if _non_member(group):  # (torch's order: the root, which raises if given as a global rank, then the group)
        _root_or_zero(src, group_src, group)
    if _outside(group, "scatter_object_list"):
        return
    gid = _check_group(group)
    src = _root_or_zero(src, group_src, group)
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise ValueError("Expected argument scatter_object_output_list to be a list of size at least 1.")
    root = get_rank(group) == src
    if root:
        if scatter_object_input_list is None:
            raise ValueError("source rank must provide non-None scatter_object_input_list")
        if len(scatter_object_input_list) != get_world_size(group):  # (the check of torch's ``scatter`` inside it)
            raise ValueError(f"ProcessGroupNCCL::scatter: Incorrect input list size {len(scatter_object_input_list)}"
                             f". Input list size should be {get_world_size(group)}, same as size of the process group.")
    _root_in_world("scatter", src, group)
    sent = session_device().runtime.exchange_objects(
        [_Pickled(o) for o in scatter_object_input_list] if root and scatter_object_input_list is not None else None,
        "scatter_object_list", gid)
    scatter_object_output_list[0] = sent[src][get_rank(group)].received()


def _ddp_class() -> Any:
    """``torch.nn.parallel.DistributedDataParallel``."""
    from torch.nn.parallel import distributed as ddp

    return ddp.DistributedDataParallel


#: what a state dict's staging copies in place of the simulator's own attributes of a tensor (then taken off)
_LEFT_BEHIND = object()


def _staged(original: Any) -> Any:
    """``torch.distributed.checkpoint``'s staging of a state dict on the host (``StateDictStager._offload_tensor``,
    ``async_save``'s): it copies a tensor's instance attributes onto the host copy, and a simulated tensor's include
    the simulator's own (its bytes, its storage's record, its run, whose greenlets do not copy: a correct program's
    ``async_save`` failed, ``cannot serialize 'greenlet.greenlet' object``). Those stay behind, as a CUDA tensor has
    none: the copy gets the program's attributes alone."""

    @functools.wraps(original)
    def offload(self: Any, x: Any, memo: Any, non_blocking: bool = False) -> Any:
        if not isinstance(x, SimTensor):
            return original(self, x, memo, non_blocking=non_blocking)
        own = [(name, v) for name, v in vars(x).items() if name in SIMULATOR_ATTRIBUTES]
        for _, v in own:
            memo[id(v)] = _LEFT_BEHIND
        try:
            y = original(self, x, memo, non_blocking=non_blocking)
        finally:
            for _, v in own:
                memo.pop(id(v), None)
        for name, _ in own:
            if getattr(y, "__dict__", {}).get(name) is _LEFT_BEHIND:
                del y.__dict__[name]
        return y

    return offload


def _get_default_group() -> _Group:
    """``distributed_c10d._get_default_group()`` (FSDP's and DeviceMesh's way to the default group): the world."""
    _initialized()
    return WORLD


#: what torchrun (``torch.distributed.run``) sets in each rank's environment, on one node: a rank of a simulated
#: world reads its own (``int(os.environ["LOCAL_RANK"])``), as each process torchrun starts does
TORCHRUN_VARIABLES = tuple(torchrun_variables(0, 1))


class RankEnviron(MutableMapping[str, str]):
    """``os.environ`` as each process of a run sees it. The run's first process (``host``) and code outside a run see
    the interpreter's environment. Every other process has an environment of its own for the run, as an operating
    system gives each process: a copy of its parent's as it was started (:meth:`started`: ``multiprocessing``'s
    ``Process.start``, a child of a rank seeing that rank's variables), or, for a rank a launcher started, the
    interpreter's with torchrun's variables (:data:`TORCHRUN_VARIABLES`) the rank's own, as torchrun sets them in
    each process it starts; what a process writes or deletes stays its own (another rank, the parent, a later run and
    the interpreter never see it: torch's Distributed Checkpoint's saving process sets ``RANK``, ``LOCAL_RANK`` and
    ``MASTER_PORT`` in its own)."""

    def __init__(self, real: MutableMapping[str, str]) -> None:
        self.real = real
        self._run: Any = None
        #: per process of the run: its environment (the copy it started with, and its own writes since)
        self._envs: dict[str, dict[str, str]] = {}

    def _env(self) -> MutableMapping[str, str]:
        """The current actor's process's environment (the interpreter's for the run's first one, or outside a
        run)."""
        if not in_actor():
            return self.real
        rt = session_device().runtime
        process = rt.current().process
        if process == "host":
            return self.real
        env = self._own(rt).get(process)
        if env is None:  # a rank a launcher started (or a process started where no parent's copy was made)
            env = self._envs[process] = self._launched(rt, process)
        return env

    def _own(self, rt: Any) -> dict[str, dict[str, str]]:
        """The environments of ``rt``'s run (a new run's processes start afresh)."""
        if self._run is not rt:
            self._run, self._envs = rt, {}
        return self._envs

    def _launched(self, rt: Any, process: str) -> dict[str, str]:
        got = rt.collectives.rank_of(process)
        if got is None or not got[0].launched:
            return dict(self.real)
        env = {k: v for k, v in self.real.items() if k not in TORCHRUN_VARIABLES}
        env.update(torchrun_variables(got[1], got[0].size))
        return env

    def started(self, child: str) -> None:
        """The current actor's process starts process ``child``: its environment is a copy of the parent's now."""
        env = dict(self._env())
        self._own(session_device().runtime)[child] = env

    def __getitem__(self, key: str) -> str:
        return self._env()[key]

    def __setitem__(self, key: str, value: str) -> None:
        env = self._env()
        if env is not self.real and not isinstance(value, str):  # (as os.environ)
            raise TypeError(f"str expected, not {type(value).__name__}")
        env[key] = value

    def __delitem__(self, key: str) -> None:
        del self._env()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._env()))

    def __len__(self) -> int:
        return len(self._env())

    def __contains__(self, key: object) -> bool:
        return key in self._env()

    def get(self, key: str, default: Any = None) -> Any:
        return self._env().get(key, default)

    def copy(self) -> dict[str, str]:
        return dict(self._env())


def _replaced() -> dict[str, Any]:
    """The functions of ``torch.distributed`` (and ``distributed_c10d``) a session replaces, by name."""
    table: dict[str, Any] = {
        "_get_default_group": _get_default_group,
        "is_available": lambda: True,
        "is_initialized": is_initialized,
        "is_nccl_available": lambda: True,
        "init_process_group": init_process_group,
        "destroy_process_group": destroy_process_group,
        "get_rank": get_rank,
        "get_world_size": get_world_size,
        "get_backend": get_backend,
        "new_group": new_group,
        "get_process_group_ranks": get_process_group_ranks,
        "all_gather_into_tensor": all_gather_into_tensor,
        "_all_gather_base": all_gather_into_tensor,
        "all_gather": all_gather,
        "all_reduce": all_reduce,
        "reduce_scatter_tensor": reduce_scatter_tensor,
        "_reduce_scatter_base": reduce_scatter_tensor,
        "broadcast": broadcast,
        "reduce": reduce,
        "all_to_all_single": all_to_all_single,
        "all_to_all": all_to_all,
        "reduce_scatter": reduce_scatter,
        "gather": gather,
        "scatter": scatter,
        "send": send,
        "recv": recv,
        "isend": isend,
        "irecv": irecv,
        "batch_isend_irecv": batch_isend_irecv,
        "barrier": barrier,
        "all_gather_object": all_gather_object,
        "broadcast_object_list": broadcast_object_list,
        "gather_object": gather_object,
        "scatter_object_list": scatter_object_list,
        "get_global_rank": get_global_rank,
        "get_group_rank": get_group_rank,
        "_resolve_process_group": _resolve_process_group,
    }
    # (torch 2.13's names; an older torch has none to replace, and a program that calls them fails there as here)
    table.update({name: value for name, value in (("all_gather_single", all_gather_single),
                                                  ("reduce_scatter_single", reduce_scatter_single))
                  if hasattr(dist, name)})
    return table


def install(p: Patches) -> None:
    """Put the simulated process group in place of ``torch.distributed``'s, and of ``distributed_c10d``'s names of the
    same functions (``torch.distributed`` re-exports them; code that calls them through that module, or imports them
    from it, gets the simulated ones too); and each rank's torchrun variables in ``os.environ``."""
    p.set(os, "environ", RankEnviron(os.environ))
    table = _replaced()
    c10d = dist.distributed_c10d
    for module, name in _bound_by_name():
        # (torch's modules that imported them by name: DeviceMesh's ``is_initialized``, ``init_process_group`` and
        # ``_resolve_process_group``, ``torch.distributed.checkpoint``'s ``_get_default_group``: each would hand on
        # the real one, which knows no simulated group)
        p.set(module, name, table[name])
    for name, value in table.items():
        if not name.startswith("_") or hasattr(dist, name):
            p.set(dist, name, value)
        if hasattr(c10d, name):
            p.set(c10d, name, value)
    p.set(c10d._World, "pg_coalesce_state", property(_coalesce_state))
    p.set(c10d._WorldMeta, "WORLD", property(_world_group))
    stager = sys.modules.get("torch.distributed.checkpoint._state_dict_stager")
    if stager is not None:  # (imported with torch.distributed.checkpoint: where the program uses it, loaded already)
        p.set(stager.StateDictStager, "_offload_tensor", _staged(stager.StateDictStager._offload_tensor))
    _meshes(p)
    for name, method in ddp.METHODS.items():
        p.set(_ddp_class(), name, method)
    for name in NOT_SIMULATED:
        if hasattr(dist, name):
            p.set(dist, name, _not_simulated(name))
        if hasattr(c10d, name):
            p.set(c10d, name, _not_simulated(name))
    p.set(torch.futures, "collect_all", _collect_all)
    p.set(torch.futures, "wait_all", _wait_all)


_COLLECT_ALL, _WAIT_ALL = torch.futures.collect_all, torch.futures.wait_all


def _collect_all(futures: list[Any]) -> Any:
    """``torch.futures.collect_all`` of a collective's futures (``Work.get_future()``, what their ``then`` made):
    :meth:`SimWorkFuture.collected`; of torch's own, torch's."""
    futures = list(futures)
    ours = [isinstance(f, SimWorkFuture) for f in futures]
    if not any(ours):
        return _COLLECT_ALL(futures)
    if not all(ours):
        raise NotImplementedError("torch.futures.collect_all of a collective's futures together with other futures "
                                  "is not simulated")
    return SimWorkFuture.collected(futures)


def _wait_all(futures: list[Any]) -> list[Any]:
    """``torch.futures.wait_all``, as torch's: each future's ``wait()``, of the futures ``collect_all`` collected."""
    futures = list(futures)
    if not any(isinstance(f, SimWorkFuture) for f in futures):
        return _WAIT_ALL(futures)  # type: ignore[no-any-return]
    return [f.wait() for f in _collect_all(futures).wait()]


def _bound_by_name() -> list[tuple[Any, str]]:
    """The globals of ``torch.distributed``'s modules loaded so far (but ``distributed_c10d``) that bound a function
    of ``distributed_c10d`` the session replaces by name (``from torch.distributed.distributed_c10d import
    _get_default_group``), as (module, name); each module looked at once (what a module bound at its import it
    keeps)."""
    c10d = dist.distributed_c10d
    out = []
    for module_name, m in sys.modules.copy().items():  # (a copy made at once: another thread may import)
        if not module_name.startswith("torch.distributed.") or m is c10d:
            continue
        seen = _BOUND.get(id(m))
        if seen is None or seen[0] is not m:
            space = vars(m)
            seen = _BOUND[id(m)] = (m, tuple(name for name, f in _ORIGINALS.items() if space.get(name) is f))
        out += [(m, name) for name in seen[1]]
    return out


#: each module of ``torch.distributed`` looked at, by id: (the module, the names :func:`_bound_by_name` found)
_BOUND: dict[int, tuple[Any, tuple[str, ...]]] = {}


def _dtensor_class() -> Any:
    """``torch.distributed.tensor.DTensor``, where it is imported (its import takes half a second: a session does
    not pay it for programs that never make a mesh)."""
    module = sys.modules.get("torch.distributed.tensor._api")
    return getattr(module, "DTensor", None)


def _local_device(name: str) -> property:
    """A DTensor's ``device`` (``is_cuda``, ``is_meta``) as its local tensor's, where that is a simulated tensor: torch
    makes a DTensor in C++ on its local tensor's C++ device, a simulated tensor's ``meta`` shell (FSDP2 took its
    sharded parameters for ones still to be materialized)."""
    own = vars(torch._C.TensorBase)[name]

    def get(self: Any) -> Any:
        local = getattr(self, "_local_tensor", None)
        return getattr(local, name) if isinstance(local, SimTensor) else own.__get__(self)

    return property(get)


def _device_mesh() -> Any:
    """``torch.distributed.device_mesh.DeviceMesh``, where this torch has one (None otherwise)."""
    module = sys.modules.get("torch.distributed.device_mesh")
    return getattr(module, "DeviceMesh", None)


def _meshes(p: Patches) -> None:
    """A ``DeviceMesh`` made in a run: torch's own, on the simulated groups (a mesh of every rank is the default
    group; of some, those ``new_group`` makes, as torch's mesh makes them), and the DTensors made on it show the
    device of their local tensors (:func:`_local_device`): DTensor, imported as the run's first mesh is made where
    the program has not yet, patched for the session. Every DTensor is made on a mesh."""
    mesh = _device_mesh()
    if mesh is None:
        return
    original = vars(mesh)["__init__"]
    shown: list[Any] = []

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if not shown:
            import torch.distributed.tensor  # noqa: F401  (the program's DTensors are this class)

            dtensor = _dtensor_class()
            for name in ("device", "is_cuda", "is_meta"):
                p.set(dtensor, name, _local_device(name))
            shown.append(dtensor)
        original(self, *args, **kwargs)
        # Each process's meshes its own, as torch makes the ranks' meshes of its threaded backend (ranks as threads of
        # one process): a mesh of one rank equal to another rank's of the same shape, torch's caches of one
        # interpreter (DTensor's sharding propagation) handed one rank's mesh to the other's DTensors, whose
        # coordinate was then the first rank's (a checkpoint's two shards were both the first).
        dev = session_device()
        self._thread_id = dev.mesh_owners.setdefault(dev.runtime.current().process, len(dev.mesh_owners) + 1)

    p.set(mesh, "__init__", init)


def patched_owners() -> list[Any]:
    dtensor, mesh = _dtensor_class(), _device_mesh()
    c10d = dist.distributed_c10d
    return [dist, c10d, c10d._World, c10d._WorldMeta, _ddp_class(), os, torch.futures,
            *(c for c in (dtensor, mesh) if c is not None),
            *{id(m): m for m, _ in _bound_by_name()}.values()]


# -- torch's functional collectives (``torch.ops._c10d_functional``: DTensor's redistribution, FSDP2's
# ``full_tensor()``, ``torch.distributed._functional_collectives``) -------------------------------------------------

#: a functional collective's reduction by torch's name for it (``to_reduce_op``)
_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
               "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND,
               "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}


def _named_group(group_name: Any) -> _Group:
    """A functional collective's group, given by its name (or as the group itself)."""
    return group_name if isinstance(group_name, _Group) else _resolve_process_group(group_name)


def _reduce_op(name: str) -> Any:
    op = _REDUCE_OPS.get(str(name).lower())
    if op is None:
        raise ValueError(f"Unrecognized reduce_op: {name}")
    return op


def _registered(outputs: list[torch.Tensor], work: Any) -> None:
    """ProcessGroupNCCL's ``register_work``: ``wait_tensor`` of each output waits for ``work`` (by its storage)."""
    dev = session_device()
    for t in outputs:
        st = storage_of(t)
        dev.functional_works[id(st)] = (st, work)


#: the functional collectives simulated, by their single form's name
_FUNCTIONAL = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "broadcast", "all_to_all_single")


def _functional(base: str, x: torch.Tensor, given: dict[str, Any], group: _Group, out: torch.Tensor | None,
                in_place: bool) -> torch.Tensor:
    """One functional collective ``base`` of ``x`` (into ``out`` where given; in place where ``in_place``): its
    output, the collective issued ``async_op=True`` and registered under it."""
    if base == "all_gather_into_tensor":
        if out is None:
            size = given["group_size"]
            out = x.new_empty((x.shape[0] * size, *x.shape[1:]) if x.dim() else (size,))
        work = all_gather_into_tensor(out, x.contiguous(), group=group, async_op=True)
    elif base == "reduce_scatter_tensor":
        if out is None:
            size = given["group_size"]
            if x.shape[0] % size:
                raise RuntimeError(f"Expected the input's first dimension ({x.shape[0]}) to be divisible by the group "
                                   f"size ({size})")
            out = x.new_empty((x.shape[0] // size, *x.shape[1:]))
        work = reduce_scatter_tensor(out, x.contiguous(), _reduce_op(given["reduce_op"]), group=group, async_op=True)
    elif base in ("all_reduce", "broadcast"):
        out = x if in_place else x.clone(memory_format=torch.contiguous_format)
        work = (all_reduce(out, _reduce_op(given["reduce_op"]), group=group, async_op=True) if base == "all_reduce"
                else broadcast(out, group_src=given["src"], group=group, async_op=True))
    else:  # (all_to_all_single)
        outs, ins = list(given["output_split_sizes"]), list(given["input_split_sizes"])
        out = x.new_empty((sum(outs) if outs else x.shape[0], *x.shape[1:]))
        work = all_to_all_single(out, x.contiguous(), outs or None, ins or None, group=group, async_op=True)
    _registered([out], work)
    return out


def functional_collective(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """An op of ``torch.ops._c10d_functional`` (and the three of ``_c10d_functional_autograd``) as ProcessGroupNCCL
    runs it: the output made on the current stream (a new tensor; a clone of the input where it reduces in place of
    a copy), the collective issued as ``async_op=True`` on the group's stream, its work registered under the
    output; ``wait_tensor(t)`` makes the current stream wait for the collective that writes ``t`` (a read before it
    races, as on a GPU). The single, ``_coalesced`` (a list each), ``_out`` and in-place (``_``) forms alike."""
    name = func._schema.name.split("::")[1]
    given = dict(zip([a.name for a in func._schema.arguments], args, strict=False))
    given.update(kwargs)
    if name == "wait_tensor":
        t = given["tensor"]
        dev = session_device()
        st = storage_of(t) if isinstance(t, SimTensor) else None
        got = dev.functional_works.pop(id(st), None) if st is not None else None
        if got is not None and got[0] is st:
            got[1].wait()
        return t
    if name == "_wrap_tensor_autograd":  # (a custom op of torch's: the tensor, to be waited for at its first use)
        from torch.distributed._functional_collectives import AsyncCollectiveTensor

        return AsyncCollectiveTensor(given["input"])
    if "group_name" not in given:
        raise NotImplementedError(f"torch.ops.{func._schema.name.replace('::', '.')} is not simulated")
    in_place = name.endswith("_")
    base = name.removesuffix("_")
    coalesced = base.endswith("_coalesced")
    base = base.removesuffix("_coalesced").removesuffix("_out")
    if base not in _FUNCTIONAL:
        raise NotImplementedError(f"torch.ops._c10d_functional.{name} is not simulated (its all-gather, "
                                  "reduce-scatter, all-reduce, broadcast and all-to-all and wait_tensor are)")
    group = _named_group(given["group_name"])
    if coalesced:
        return [_functional(base, x, given, group, None, in_place) for x in given["inputs"]]
    return _functional(base, given["input"], given, group, given.get("out"), in_place)


handle_namespace("_c10d_functional", functional_collective)
handle_namespace("_c10d_functional_autograd", functional_collective)

#: ``distributed_c10d``'s own functions that a session replaces, by name (as torch defines them: read at import)
_ORIGINALS = {name: vars(dist.distributed_c10d)[name] for name in _replaced() if name in vars(dist.distributed_c10d)}
