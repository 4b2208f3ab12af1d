"""Small contract programs for hazards of the simulator's model, shared by tests/property and tests/gpu.

``freed_while_side_reads``: the ``record_stream`` hazard. A tensor made on the compute stream is read by a side
stream, then dropped; the caching allocator hands its block to the next allocation on the compute stream, which
overwrites it, while the side stream may still be reading it. ``t.record_stream(side)`` before the drop makes the
allocator hold the block back until the side stream is past that point.

``backward_off_its_stream``: plain torch.cuda code (run through the drop-in): backward's stream semantics, each
backward op on its forward op's stream.

``singleton_stream_reload``, ``device_block_reload`` and ``printed_reload``: plain torch.cuda code the way real
programs make their streams and tensors and log them: a D2H stream kept in a module global, made at the first call
(each run of a target starts from its module as it was); a tensor made inside ``with torch.device("cuda")``
(model-init code); a print of a device tensor, which reads its values and so waits for its stream.

``python_data_on_device`` and ``list_index_backward``: plain torch.cuda code that puts Python data on the device
(``torch.tensor([...], device="cuda")``, a list as an index), which torch copies below the dispatch modes: no
operation on either machine, but a blocking copy that waits for the current stream.

``streams_module_reload``: a stream made through ``torch.cuda.streams.Stream()``, where torch defines the class,
named and counted on both machines as ``torch.cuda.Stream()``'s.

``pinned_snapshot_saved``: ``torch.save`` of a pinned snapshot, which reads its bytes in C++ (no operation on either
machine), while the D2H into it may still run. ``reentered_stream_context``: one ``torch.cuda.stream(s)`` object
entered again inside its own block, which torch's class leaves ``s`` current after. ``numpy_staging_filled``: a
pinned staging buffer filled through a NumPy view (no operation on either machine) while the H2D from it may still
read it. ``inference_prefetch``: weights prefetched on a side stream under ``torch.inference_mode()``, where
``to`` runs whole (counted as the copy it makes on both machines). ``backward_sets_its_stream``: a custom
Function's backward that leaves a side stream current, which autograd's engine puts back after the node.
``emptied_cache_read``: ``torch.cuda.empty_cache()`` that gives a segment back to CUDA waits for the whole device.
``scripted_side_read``: a function TorchScript compiles in the run, called on a side stream, its result read on the
default stream with or without a wait.
``lazy_model_reload``: a lazy model moved to the device before its first forward. ``accelerator_reload`` and
``loader_batch_reused``: device-agnostic code (``torch.accelerator``, the generic
``torch.Stream`` and ``torch.Event``) and a ``DataLoader``'s pinned batch, reused by the host while its copy may
still read it. ``legacy_type_reload``: ``torch.cuda.FloatTensor``, older code's legacy tensor type, made and moved
to, while the H2D from a pinned buffer may still read it. ``meta_model_reload``: a model built on the meta device and
given memory with ``to_empty``. ``device_index_reload``: the device named by its index (``torch.device(0)``,
``model.to(0)``). ``loaded_checkpoint_reload``: a checkpoint loaded onto the device
(``torch.load(path, map_location="cuda")``). ``compiled_reload``: a model compiled with ``torch.compile``.
``inplace_views_reload``: a tensor reshaped in place (``unsqueeze_``, ``t_``) and compared by ``is_same_size``.
``unwritten_staging_read``: a pinned staging buffer made from a host ``torch.empty``, poisoned on both machines, read
while the D2H into it may still run. ``storage_onload``: a parameter offloaded, released and brought back by its
storage (``untyped_storage().copy_``, ``resize_``), read while the H2D into it may still run.
``subclass_reload`` and ``nested_reload``: a program's wrapper tensor subclass over device tensors (a scaled
low-precision weight, its backward run) and ``torch.nested``'s jagged tensor, each computed with, then offloaded.
``pooled_layer_streams``: a stream per layer, 40 layers: CUDA's pool hands layer 32 layer 0's stream, so its read of
what layer 0 wrote is ordered, where layer 1's is not.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from reference.contract import Device


def freed_while_side_reads(dev: Device, record: bool, n: int = 4096) -> torch.Tensor:
    """What the side stream copied out of the dropped tensor (all ones when nothing overwrote it first)."""
    side = dev.Stream(name="side")
    out = torch.empty(n, device=dev.device)
    a = torch.ones(n, device=dev.device)
    # wait: the side stream must not read a before the compute stream filled it
    side.wait_stream(dev.current_stream())
    with dev.stream(side):
        out.copy_(a)
    if record:
        # keep: the allocator must not hand a's block out again before the side stream is done reading it
        a.record_stream(side)
    del a
    b = torch.full((n,), 2.0, device=dev.device)  # the compute stream's next allocation of that size
    # wait: the host reads the copy only once both streams are done
    dev.synchronize()
    del b
    return out.cpu()


def backward_off_its_stream(wait: int = 1) -> None:
    """Plain torch.cuda (a drop-in program): a forward on a side stream, ``backward()`` on the default one. PyTorch
    runs each backward op on its forward op's stream and syncs them with the stream backward is called on, so the
    gradient is right; without ``wait`` the forward reads ``x`` before the default stream made it."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64).cuda()
    host_x = torch.randn(32, 64)
    x = host_x.cuda().mul(2.0)  # a kernel on the default stream
    s = torch.cuda.Stream()
    if wait:
        s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        loss = torch.nn.functional.gelu(lin(x)).pow(2).mean()
    loss.backward()
    got = lin.weight.grad.cpu()
    ref = torch.nn.Linear(64, 64)
    ref.load_state_dict({k: v.cpu() for k, v in lin.state_dict().items()})
    torch.nn.functional.gelu(ref(host_x.mul(2.0))).pow(2).mean().backward()
    assert torch.allclose(got, ref.weight.grad, rtol=1e-3, atol=1e-5), "the gradient differs from the host's"


_D2H: torch.cuda.Stream | None = None


def _d2h_stream() -> torch.cuda.Stream:
    global _D2H
    if _D2H is None:  # made at the first call, reused by every later one
        _D2H = torch.cuda.Stream()
    return _D2H


def _offload_on(s: torch.cuda.Stream, act: torch.Tensor, wait: int) -> None:
    """A D2H of ``act`` (``arange``) into pinned memory on ``s``; the host reads the copy after ``s.synchronize()``
    (or, without ``wait``, at once: stale)."""
    pinned = torch.empty(act.numel(), pin_memory=True)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        pinned.copy_(act, non_blocking=True)
    if wait:
        s.synchronize()
    assert torch.equal(pinned, torch.arange(act.numel(), dtype=torch.float32)), "the host read the copy too early"


def singleton_stream_reload(wait: int = 1, n: int = 1 << 20) -> None:
    """The D2H on a module-level stream, ``D2H``."""
    _offload_on(_d2h_stream(), torch.arange(n, dtype=torch.float32, device="cuda"), wait)


def device_block_reload(wait: int = 1, n: int = 1 << 20) -> None:
    """The D2H, of a tensor made inside ``with torch.device("cuda")``, on a side stream, ``side``."""
    with torch.device("cuda"):
        act = torch.arange(n, dtype=torch.float32)
    side = torch.cuda.Stream()
    _offload_on(side, act, wait)


def streams_module_reload(wait: int = 1, n: int = 1 << 20) -> None:
    """The D2H on a stream made through ``torch.cuda.streams``, where torch defines the class (a prefetcher's
    ``torch.cuda.streams.Stream() if torch.cuda.is_available() else None``), ``prefetch``."""
    prefetch = torch.cuda.streams.Stream()
    _offload_on(prefetch, torch.arange(n, dtype=torch.float32, device="cuda"), wait)


def printed_reload(wait: int = 1, n: int = 1 << 20) -> None:
    """A D2H into pinned memory on the current stream, then (with ``wait``) a print of part of the source, which
    reads its values and so waits for the stream, then the host reads the copy."""
    act = torch.arange(n, dtype=torch.float32, device="cuda")
    pinned = torch.empty(n, pin_memory=True)
    pinned.copy_(act, non_blocking=True)
    if wait:
        print(f"first elements: {act[:2]}")
    assert torch.equal(pinned, torch.arange(n, dtype=torch.float32)), "the host read the copy before it landed"


def python_data_on_device(wait: int = 1, n: int = 1 << 20) -> None:
    """Python data put on the device (``torch.tensor``, ``as_tensor``, ``asarray``, ``new_tensor`` of a list or a
    number, also in a side stream's block: copies no dispatch mode sees) among a NumPy array's and a host tensor's
    (``.to()``: ``_to_copy``, an operation on both machines); then a D2H into pinned memory on the current stream,
    ``default#3``, and, with ``wait``, one more list put on the device, whose blocking copy waits for that stream
    before the host reads the pinned copy."""
    act = torch.arange(n, dtype=torch.float32, device="cuda")
    side = torch.cuda.Stream()
    made = [torch.tensor([1.0, 2.0], device="cuda"), torch.as_tensor([3.0], device="cuda"),
            torch.asarray([4.0], device="cuda"), act.new_tensor([5.0]), torch.tensor(6.0, device="cuda"),
            torch.tensor(np.array([7.0], dtype=np.float32), device="cuda"),
            torch.as_tensor(torch.tensor([8.0]), device="cuda")]
    with torch.cuda.stream(side):
        made.append(torch.tensor([9.0], device="cuda"))
    pinned = torch.empty(n, pin_memory=True)
    pinned.copy_(act, non_blocking=True)
    if wait:
        made.append(torch.tensor([10.0], device="cuda"))
    assert torch.equal(pinned, torch.arange(n, dtype=torch.float32)), "the host read the copy before it landed"
    got = torch.cat([m.reshape(-1) for m in made]).cpu().tolist()
    assert got == [float(k) for k in range(1, 10 + (wait > 0))], got


def assigned_numbers(kind: int = 0, n: int = 1 << 20) -> None:
    """A Python number assigned into a device tensor, after a D2H into pinned memory on the current stream,
    ``default#3``; then the host reads the pinned copy. torch makes the number a host tensor for a CUDA tensor, and
    the assignment: ``kind`` 0, ``t[0] = 2.0``, copies it (``copy_``, a blocking copy from pageable memory: the host
    waits for the stream); 1, ``t[idx] = 1.0``, puts it (``index_put_``, whose kernel moves the value with a
    blocking copy: the host waits); 2, ``t[2:4] = 3.0``, fills with it (``fill_``, the value read on the host: no
    wait); 3, ``t[mask] = 1.0``, a mask's fill (no wait). One counted operation each on both machines."""
    act = torch.arange(n, dtype=torch.float32, device="cuda")
    t = torch.zeros(8, device="cuda")
    idx = torch.tensor([1, 3], device="cuda")  # (Python data: no operation on either machine)
    mask = t < 0
    pinned = torch.empty(n, pin_memory=True)
    pinned.copy_(act, non_blocking=True)
    if kind == 0:
        t[0] = 2.0
    elif kind == 1:
        t[idx] = 1.0
    elif kind == 2:
        t[2:4] = 3.0
    else:
        t[mask] = 1.0
    assert torch.equal(pinned, torch.arange(n, dtype=torch.float32)), "the host read the copy before it landed"


def list_index_backward(wait: int = 0, n: int = 1 << 20) -> None:
    """Rows gathered by a list index (``table[[1, 3]]``: torch makes it a device tensor below the dispatch modes,
    and autograd saves that) and by a NumPy array (moved by ``.to()``, an operation on both machines); an H2D from
    pinned memory on the current stream, ``default#7``; the backward, whose ``index_put`` takes the saved device
    indices and so waits for nothing; then the host refills the pinned buffer: before the H2D read it, unless
    ``wait`` synchronizes the stream first."""
    table = torch.zeros(16, 4, device="cuda", requires_grad=True)
    rows = table[[1, 3]]
    more = table[np.array([2, 5])]
    loss = rows.sum() + more.sum()
    pinned = torch.ones(n, pin_memory=True)
    dev = torch.empty(n, device="cuda")
    dev.copy_(pinned, non_blocking=True)
    loss.backward()
    if wait:
        torch.cuda.current_stream().synchronize()
    pinned.fill_(2.0)
    assert torch.equal(dev.cpu(), torch.ones(n)), "the host refilled the pinned buffer before the H2D read it"
    want = torch.zeros(16, 4)
    want[[1, 2, 3, 5]] = 1.0
    assert torch.equal(table.grad.cpu(), want), "the gradient differs from the host's"


def pinned_snapshot_saved(wait: int = 0, n: int = 1 << 20) -> None:
    """An asynchronous checkpoint: the weights copied D2H into a pinned snapshot on the current stream,
    ``default#1``, then saved with ``torch.save``, which reads the snapshot's bytes in C++; with ``wait`` the host
    synchronizes the stream first. The file read back must hold the weights."""
    w = torch.arange(n, dtype=torch.float32, device="cuda")
    snapshot = torch.empty(n, pin_memory=True)
    snapshot.copy_(w, non_blocking=True)
    if wait:
        torch.cuda.current_stream().synchronize()
    buf = io.BytesIO()
    torch.save({"w": snapshot}, buf)
    buf.seek(0)
    saved = torch.load(buf)["w"]
    assert torch.equal(saved, torch.arange(n, dtype=torch.float32)), "the checkpoint saved the snapshot early"


def reentered_stream_context(n: int = 1 << 20) -> None:
    """``ctx = torch.cuda.stream(s)`` entered, and again inside its own block: torch's ``StreamContext`` keeps one
    stream to go back to, so ``s`` is still current after the outer block, and the fill runs there; the D2H on
    ``s`` after it is then ordered after it. (A stack of blocks would leave the default stream current: the fill
    there, unordered with the D2H.)"""
    s = torch.cuda.Stream()
    ctx = torch.cuda.stream(s)
    t = torch.zeros(n, device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with ctx, ctx:  # (entered, then again inside its own block)
        pass
    assert torch.cuda.current_stream() == s, "the context's stream is not current after its block"
    t.fill_(1.0)
    pinned = torch.empty(n, pin_memory=True)
    with torch.cuda.stream(s):
        pinned.copy_(t, non_blocking=True)
    s.synchronize()
    assert torch.equal(pinned, torch.ones(n)), "the D2H read the tensor before its fill"


def numpy_staging_filled(wait: int = 0, n: int = 1 << 20) -> None:
    """An inference loop's input staging, as vLLM's model runner keeps it: a pinned buffer and a NumPy view of it
    made once; the host fills the view, copies the buffer to the device without blocking (``default#0``), then
    fills the view for the next step; with ``wait`` it synchronizes the stream first. The device must hold the
    first step's values."""
    buf = torch.zeros(n, pin_memory=True)
    view = buf.numpy()
    view[:] = 1.0
    first = buf.to("cuda", non_blocking=True)
    if wait:
        torch.cuda.current_stream().synchronize()
    view[:] = 2.0
    assert bool((first == 1.0).all()), "the copy read the next step's values"


def inference_prefetch(wait: int = 1, n: int = 1 << 16) -> None:
    """A serving loop's weight prefetch, as inference engines run it: everything under ``torch.inference_mode()``
    (where ``to`` runs whole, autograd skipped), the pinned host weights put on the device with
    ``to("cuda", non_blocking=True)`` on a side stream, ``prefetch``, then used on the current stream; with
    ``wait`` the current stream waits for ``prefetch`` first. The output must be the host's."""
    host = torch.arange(n, dtype=torch.float32).pin_memory()
    prefetch = torch.cuda.Stream()
    with torch.inference_mode():
        x = torch.ones(n, device="cuda")
        prefetch.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(prefetch):
            w = host.to("cuda", non_blocking=True)
        if wait:
            torch.cuda.current_stream().wait_stream(prefetch)
        w.record_stream(torch.cuda.current_stream())
        y = (x * w).cpu()
        w.fill_(-1.0)  # (a block the next call's allocation may be given holds no weights from this one)
    assert torch.equal(y, torch.arange(n, dtype=torch.float32)), "the weights were read before their copy landed"


class _SideBackward(torch.autograd.Function):
    """The identity; its backward moves to ``ctx.side`` with ``torch.cuda.set_stream`` (no context, nothing puts
    it back), computes the gradient there and synchronizes that stream."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, side: torch.cuda.Stream) -> torch.Tensor:
        ctx.side = side
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.side.wait_stream(torch.cuda.current_stream())
        torch.cuda.set_stream(ctx.side)
        out = g * 2
        torch.cuda.current_stream().synchronize()
        return out, None


def backward_sets_its_stream(n: int = 1 << 20) -> None:
    """A custom Function's backward that leaves a side stream current (``set_stream``) in a graph whose nodes were
    all made on the default stream: autograd's engine puts each node's stream back after it (a stream guard), so
    the next node (the ``mul``'s) and the caller after ``backward()`` run on the default stream, and the caller's
    ``add_`` of the gradient is ordered after the node that wrote it; the D2H then waits for it."""
    side = torch.cuda.Stream()
    x = torch.ones(n, device="cuda", requires_grad=True)
    _SideBackward.apply(x * 3, side).sum().backward()
    assert torch.cuda.current_stream() == torch.cuda.default_stream(), "the backward's stream is still current"
    total = torch.zeros(n, device="cuda")
    total.add_(x.grad)
    host = torch.empty(n, pin_memory=True)
    host.copy_(total, non_blocking=True)
    torch.cuda.current_stream().synchronize()
    assert torch.equal(host, torch.full((n,), 6.0)), "the gradient was read before it was written"


def pooled_layer_streams(reader: int = 32, n: int = 1 << 20) -> None:
    """A stream per layer, as offload code that keeps one for each layer makes them: layer 0's stream (``streams``)
    writes a buffer, layer ``reader``'s reads it, with no event between. ``torch.cuda.Stream()`` hands out CUDA's 32
    streams of a priority in turn, so layer 32's is layer 0's stream and its read comes after the write; layer 1's is
    another stream, and its read races the write."""
    streams = [torch.cuda.Stream() for _ in range(40)]
    x = torch.ones(n, device="cuda")
    buf = torch.zeros(n, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(streams[0]):
        buf.copy_(x * 2)
    with torch.cuda.stream(streams[reader]):
        y = buf + 1
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full((n,), 3.0, device="cuda")), "the layer's read came before layer 0's write"


def scripted_side_read(wait: int = 1, n: int = 1 << 20) -> None:
    """A function TorchScript compiles in the run (its ``torch.zeros`` and ``torch.tensor`` are aten builtins to it)
    writes ``out`` on ``side``; the default stream reads ``out`` after waiting for ``side`` (``wait``) or without:
    then it reads the -1 ``out`` was filled with."""

    @torch.jit.script
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * 3 + torch.zeros(x.shape, device=x.device) + torch.tensor(1.0, device=x.device)

    x = torch.ones(n, device="cuda")
    out = torch.full((n,), -1.0, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out.copy_(scaled(x))
    if wait:
        torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(out + 1, torch.full((n,), 5.0, device="cuda")), "read before the side stream wrote it"


def emptied_cache_read(release: int = 1, n: int = 1 << 20) -> None:
    """A D2H into pinned memory on ``side``, then ``torch.cuda.empty_cache()`` and the host's read of the copy, no
    synchronize. With ``release`` the default stream's scratch block was dropped just before, so ``empty_cache``
    gives its segment back to CUDA (``cudaFree``, which waits for the whole device: the copy is done when the host
    reads it); without, it has no segment to give back and waits for nothing (a race). The cache is emptied at the
    start, so that no segment a caller left behind is given back."""
    torch.cuda.empty_cache()
    act = torch.arange(n, dtype=torch.float32, device="cuda")
    scratch = torch.zeros(1 << 18, device="cuda")  # (1 MiB: a small segment of its own)
    pinned = torch.empty(n, pin_memory=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        pinned.copy_(act, non_blocking=True)
    if release:
        del scratch
    torch.cuda.empty_cache()
    assert torch.equal(pinned, torch.arange(n, dtype=torch.float32)), "the host read the copy before it landed"


def accelerator_reload(wait: int = 1, n: int = 1 << 20) -> None:
    """Device-agnostic code: the device from ``torch.accelerator``, a generic ``torch.Stream`` entered as a context
    (``side``) for a D2H into pinned memory, a generic ``torch.Event`` recorded there; the host waits on the event
    (``wait``), then reads the copy."""
    dev = torch.accelerator.current_accelerator()
    side = torch.Stream(device=dev)
    act = torch.arange(n, dtype=torch.float32, device=dev)
    pinned = torch.empty(n, pin_memory=True)
    side.wait_stream(torch.accelerator.current_stream())
    with side:
        pinned.copy_(act, non_blocking=True)
        done = torch.Event()
        done.record()
    if wait:
        done.synchronize()
    assert torch.equal(pinned, torch.arange(n, dtype=torch.float32)), "the host read the copy before it landed"


def loader_batch_reused(wait: int = 1, n: int = 1 << 18) -> None:
    """A batch of ``DataLoader(pin_memory=True)`` (pinned, as the loader pins it where there is an accelerator) put on
    the device without blocking (``default#0``), then the host zeroes the batch for its own reuse; with ``wait`` it
    synchronizes the stream first. The device must hold the batch as loaded."""
    from torch.utils.data import DataLoader, TensorDataset

    data = torch.arange(4 * n, dtype=torch.float32).reshape(4, n)
    (batch,) = next(iter(DataLoader(TensorDataset(data), batch_size=4, pin_memory=True)))
    on_device = batch.to("cuda", non_blocking=True)
    if wait:
        torch.cuda.current_stream().synchronize()
    batch.zero_()
    assert torch.equal(on_device.cpu(), data), "the copy read the batch after the host reused it"


def _offloaded_then_read(y: torch.Tensor, n: int, wait: int, device: torch.device | None = None) -> None:
    """``y`` (``n`` elements) copied D2H into pinned memory on a side stream (``side``, after the current stream; on
    ``device`` where given, as the program names it); the host reads the copy after ``side.synchronize()``
    (``wait``) or at once."""
    pinned = torch.empty(n, pin_memory=True)
    side = torch.cuda.Stream() if device is None else torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream() if device is None else torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        pinned.copy_(y, non_blocking=True)
    if wait:
        side.synchronize()
    assert torch.equal(pinned, y.cpu()), "the host read the copy before it landed"


def lazy_model_reload(wait: int = 1, n: int = 1 << 14) -> None:
    """A lazy model moved to the device before its first forward (``LazyLinear(...).cuda()``: its parameters made
    there as the forward infers their shapes), its output copied D2H into pinned memory on ``side``; the host reads
    the copy after ``side.synchronize()`` (``wait``) or at once."""
    model = torch.nn.Sequential(torch.nn.LazyLinear(64), torch.nn.ReLU(), torch.nn.LazyLinear(n // 4)).cuda()
    y = model(torch.ones(4, 32, device="cuda")).flatten()
    _offloaded_then_read(y, n, wait)


def legacy_type_reload(wait: int = 1, n: int = 1 << 20) -> None:
    """Older code's legacy tensor types: a pinned staging buffer moved with ``.type(torch.cuda.FloatTensor, True)``
    (an H2D on ``default``, non-blocking), copied into a buffer made with ``torch.cuda.FloatTensor(n)``; then the
    host refills the staging buffer, after ``torch.cuda.current_stream().synchronize()`` (``wait``) or at once."""
    staging = torch.arange(n, dtype=torch.float32).pin_memory()
    moved = staging.type(torch.cuda.FloatTensor, True)
    assert isinstance(moved, torch.cuda.FloatTensor)
    out = torch.cuda.FloatTensor(n)
    out.copy_(moved)
    if wait:
        torch.cuda.current_stream().synchronize()
    staging.fill_(-1.0)
    assert torch.equal(out.cpu(), torch.arange(n, dtype=torch.float32)), "the H2D read the staging buffer refilled"


def meta_model_reload(wait: int = 1, n: int = 1 << 14) -> None:
    """A model built on the meta device (``with torch.device("meta")``), given memory on the device with
    ``to_empty(device="cuda")`` and initialized there, as large-model code builds one; its output copied D2H into
    pinned memory on ``side``; the host reads the copy after ``side.synchronize()`` (``wait``) or at once."""
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, n // 4))
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cuda")
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.reset_parameters()
    y = model(torch.ones(4, 32, device="cuda")).flatten()
    _offloaded_then_read(y, n, wait)


def device_index_reload(wait: int = 1, n: int = 1 << 14) -> None:
    """Code that names the device by its index (``torch.device(local_rank)``, ``model.to(local_rank)``): a model moved
    with ``.to(0)``, its input made on ``torch.device(0)``, its output copied D2H into pinned memory on ``side``; the
    host reads the copy after ``side.synchronize()`` (``wait``) or at once."""
    device = torch.device(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, n // 4)).to(0)
    y = model(torch.ones(4, 32, device=device)).flatten()
    _offloaded_then_read(y, n, wait, device)


def loaded_checkpoint_reload(wait: int = 1, n: int = 1 << 14) -> None:
    """A checkpoint saved from the host and loaded onto the device (``torch.load(path, map_location="cuda")``, each
    storage copied there as torch copies it), its state dict loaded into a model on the device; the model's output
    copied D2H into pinned memory on ``side``; the host reads the copy after ``side.synchronize()`` (``wait``) or at
    once."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, n // 4))
    with tempfile.TemporaryDirectory() as folder:
        torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
        state = torch.load(os.path.join(folder, "model.pt"), map_location="cuda")
    assert all(t.is_cuda for t in state.values())
    on_device = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, n // 4)).cuda()
    on_device.load_state_dict(state)
    y = on_device(torch.ones(4, 32, device="cuda")).flatten()
    _offloaded_then_read(y, n, wait)


def compiled_reload(wait: int = 1, n: int = 1 << 14) -> None:
    """A model compiled with ``torch.compile`` (run eagerly on both machines, so both count the same operations), its
    output copied D2H into pinned memory on ``side``; the host reads the copy after ``side.synchronize()``
    (``wait``) or at once."""
    torch.manual_seed(0)
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                              torch.nn.Linear(64, n // 4)).cuda())
    y = model(torch.ones(4, 32, device="cuda")).flatten()
    _offloaded_then_read(y, n, wait)


def inplace_views_reload(wait: int = 1, n: int = 1 << 14) -> None:
    """A tensor reshaped in place (``unsqueeze_``, ``t_``, ``squeeze_``: its own shape changed, no kernel) and
    compared by its metadata (``is_same_size``, no kernel, no wait), then copied D2H into pinned memory on ``side``;
    the host reads the copy after ``side.synchronize()`` (``wait``) or at once."""
    x = torch.arange(n, dtype=torch.float32, device="cuda").view(2, n // 2)
    x.t_()
    x.unsqueeze_(0)
    assert x.shape == (1, n // 2, 2)
    assert x.is_same_size(torch.empty(1, n // 2, 2))
    x.squeeze_(0)
    y = (x.t().contiguous() * 1.0).flatten()
    _offloaded_then_read(y, n, wait)


class ScaledWeight(torch.Tensor):
    """A low-precision weight and its scale, as a float8 training library keeps one: a wrapper tensor subclass over
    two device tensors, whose every op computes with ``data * scale``."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale: torch.Tensor, requires_grad: bool = False) -> ScaledWeight:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined,no-any-return]
            cls, data.shape, dtype=torch.float32, device=data.device, requires_grad=requires_grad)

    def __init__(self, data: torch.Tensor, scale: torch.Tensor, requires_grad: bool = False) -> None:
        self.low, self.scale = data, scale

    def __repr__(self) -> str:
        return f"ScaledWeight({self.low!r}, {self.scale!r})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        def wide(t: Any) -> Any:
            return t.low.float() * t.scale if isinstance(t, ScaledWeight) else t

        return func(*[wide(a) for a in args], **{k: wide(v) for k, v in (kwargs or {}).items()})


def subclass_reload(wait: int = 1, n: int = 1 << 12) -> None:
    """An input's gradient through a :class:`ScaledWeight` (bfloat16 ones scaled by a half; autograd runs the
    subclass's backward), copied D2H into pinned memory on ``side``; the host reads the copy after
    ``side.synchronize()`` (``wait``) or at once."""
    k = 64
    w = ScaledWeight(torch.ones(k, k, dtype=torch.bfloat16, device="cuda"), torch.tensor(0.5, device="cuda"),
                     requires_grad=True)
    assert w.is_cuda
    assert w.device.type == "cuda"
    x = torch.ones(n // k, k, device="cuda", requires_grad=True)
    (x @ w).sum().backward()
    assert x.grad is not None
    _offloaded_then_read(x.grad.flatten(), n, wait)


def nested_reload(wait: int = 1, n: int = 1 << 12) -> None:
    """Two sequences of lengths n/4 and 3n/4 in a jagged nested tensor on the device (``torch.nested``, a wrapper
    subclass over one values tensor), doubled; its values copied D2H into pinned memory on ``side``; the host reads
    the copy after ``side.synchronize()`` (``wait``) or at once."""
    seqs = [torch.arange(n // 4, dtype=torch.float32, device="cuda"),
            torch.arange(3 * n // 4, dtype=torch.float32, device="cuda")]
    nt = torch.nested.nested_tensor(seqs, layout=torch.jagged)
    assert nt.is_cuda
    _offloaded_then_read((nt * 2).values(), n, wait)


def profiled_reload(wait: int = 1, n: int = 1 << 12, inside: int = 1) -> None:
    """An offload profiled by ``torch.profiler`` with its CPU and CUDA activities, as a training loop profiles a
    step (``nvtx`` ranges around it): ``arange`` copied D2H into pinned memory on ``side``; the host reads the copy
    inside the profiler's block (``inside``), after ``side.synchronize()`` (``wait``) or at once, or once the block
    is left, which synchronizes the device when CUDA is profiled."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    assert torch.profiler.ProfilerActivity.CUDA in torch.profiler.supported_activities()
    y = torch.arange(n, dtype=torch.float32, device="cuda")
    pinned = torch.empty(n, pin_memory=True)
    side = torch.cuda.Stream()
    with torch.profiler.profile(activities=activities):
        with torch.cuda.nvtx.range("offload"):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                pinned.copy_(y, non_blocking=True)
        if inside:
            if wait:
                side.synchronize()
            assert torch.equal(pinned, torch.arange(n, dtype=torch.float32)), "the host read the copy before it landed"
    assert torch.equal(pinned, torch.arange(n, dtype=torch.float32)), "the host read the copy before it landed"


def _copied_on_side(dst: torch.Tensor, wait: int) -> torch.cuda.Stream:
    """``arange`` copied D2H non-blocking into host memory ``dst`` on a new stream ``side``, after the current stream's
    work, and ``side.synchronize()`` where ``wait``: the stream."""
    y = torch.arange(dst.numel(), dtype=torch.float32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dst.copy_(y, non_blocking=True)
    if wait:
        side.synchronize()
    return side


def registered_reload(wait: int = 1, n: int = 1 << 12) -> None:
    """A host buffer the program already has, pinned in place with ``torch.cuda.cudart().cudaHostRegister`` (as an
    offload library pins its host pool), ``arange`` copied D2H into it non-blocking on ``side``; the host reads it
    after ``side.synchronize()`` (``wait``) or at once; then unregistered."""
    cudart = torch.cuda.cudart()
    host = torch.zeros(n)
    assert cudart.cudaHostRegister(host.data_ptr(), n * host.element_size(), 0) == cudart.cudaError.success
    assert host.is_pinned()
    side = _copied_on_side(host, wait)
    try:
        assert torch.equal(host, torch.arange(n, dtype=torch.float32)), "the host read the copy before it landed"
    finally:
        side.synchronize()
        assert cudart.cudaHostUnregister(host.data_ptr()) == cudart.cudaError.success
    assert not host.is_pinned()


def printed_pinned_reload(wait: int = 1, n: int = 1 << 12) -> None:
    """``arange`` copied D2H non-blocking on ``side`` into a pinned buffer of zeros, which the host then prints (a
    log line: ``str``, torch's text, made with the dispatch modes off) after ``side.synchronize()`` (``wait``) or at
    once."""
    pinned = torch.zeros(n, pin_memory=True)
    side = _copied_on_side(pinned, wait)
    line = f"last values {pinned[-3:]}"
    side.synchronize()
    assert line == f"last values {torch.arange(n - 3, n, dtype=torch.float32)}", "the log printed a copy not landed"


def unwritten_staging_read(wait: int = 1, n: int = 1 << 12) -> None:
    """A staging buffer made from host memory nobody wrote (``torch.empty(n).pin_memory()``), which both machines
    poison (NaN: what the process freed there before would make each run another), ``arange`` copied D2H into it
    non-blocking on ``side``; the host reads it after ``side.synchronize()`` (``wait``) or at once."""
    host = torch.empty(n).pin_memory()
    assert bool(torch.isnan(host).all()), "host memory nobody wrote was not poisoned"
    side = _copied_on_side(host, wait)
    try:
        assert torch.equal(host, torch.arange(n, dtype=torch.float32)), "the host read the copy before it landed"
    finally:
        side.synchronize()


def storage_onload(wait: int = 1, n: int = 1 << 12) -> None:
    """A parameter offloaded and brought back by its storage, as offload code does it: its bytes copied to a pinned
    buffer (``untyped_storage().copy_``, blocking), its device memory released (``resize_(0)``), then on ``side``
    given back (``resize_`` to its size) and filled from the pinned buffer without blocking; the current stream
    waits for ``side`` (``wait``) or not before it reads the parameter."""
    p = torch.nn.Parameter(torch.arange(n, dtype=torch.float32, device="cuda"))
    size = p.data.untyped_storage().size()
    pinned = torch.empty(n, pin_memory=True)
    pinned.untyped_storage().copy_(p.data.untyped_storage())
    p.data.untyped_storage().resize_(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        p.data.untyped_storage().resize_(size)
        p.data.untyped_storage().copy_(pinned.untyped_storage(), non_blocking=True)
    if wait:
        torch.cuda.current_stream().wait_stream(side)
    assert torch.equal((p * 2).detach().cpu(), torch.arange(n, dtype=torch.float32) * 2), "read before the onload"


def sequential_offload(wait: int = 1, n: int = 1 << 12) -> None:
    """``accelerate``'s sequential offload with grad enabled: each block's pinned weights moved to the device without
    blocking, the block run (from the second on, its graph holds a view of its weight: its input needs a gradient),
    moved back without blocking (into new pinned memory); the host reads the weights after ``synchronize()``
    (``wait``) or at once."""
    torch.manual_seed(0)
    blocks = [torch.nn.Linear(64, 64) for _ in range(2)]
    for b in blocks:
        for p in b.parameters():
            p.data = p.data.pin_memory()
    before = [b.weight.detach().clone() for b in blocks]
    y = torch.ones(n // 64, 64, device="cuda", requires_grad=True)
    for b in blocks:
        b.to("cuda", non_blocking=True)
        y = torch.tanh(b(y))
        b.to("cpu", non_blocking=True)
    if wait:
        torch.cuda.synchronize()
    for b, w in zip(blocks, before, strict=True):
        assert torch.equal(b.weight.detach(), w), "the host read a weight before its move back landed"


def amp_reload(wait: int = 1, n: int = 1 << 12) -> None:
    """A linear layer applied twice under ``torch.autocast("cuda", dtype=torch.bfloat16)`` (its weight and bias cast
    once: autocast's cache), its bfloat16 output copied D2H into a bfloat16 pinned buffer on ``side``; the host reads
    the copy after ``side.synchronize()`` (``wait``) or at once. Then the loss's backward, outside the block: the
    weight's gradient float32, as the weight."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64).cuda()
    x = torch.full((n // 64, 64), 0.01, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = lin(lin(x))
        loss = y.float().pow(2).mean()
    assert y.dtype == torch.bfloat16
    pinned = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        pinned.copy_(y.flatten(), non_blocking=True)
    if wait:
        side.synchronize()
    assert torch.equal(pinned, y.flatten().cpu()), "the host read the copy before it landed"
    loss.backward()
    assert lin.weight.grad is not None
    assert lin.weight.grad.dtype == torch.float32


def _amp(fn: Callable[[], Any], dtype: torch.dtype | None = None) -> Callable[[], Any]:
    """``fn`` run under ``torch.autocast("cuda")`` (its default dtype, float16, unless ``dtype``)."""

    def run() -> Any:
        with torch.autocast("cuda", dtype=dtype) if dtype is not None else torch.autocast("cuda"):
            return fn()

    return run


def _dev(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.full(shape, 0.5, dtype=dtype, device="cuda")


def _linear_grad() -> Any:
    lin = torch.nn.Linear(4, 4).cuda()
    with torch.autocast("cuda"):
        y = lin(_dev(2, 4))
    y.float().sum().backward()
    return lin.weight.grad


def _disabled_inside() -> Any:
    with torch.autocast("cuda", enabled=False):
        return _dev(4, 4) @ _dev(4, 4)


#: ops under ``torch.autocast("cuda")`` and the dtype of what each gives on a GPU (ATen's CUDA autocast table: a
#: matmul's inputs cast to the lower precision, a softmax's output set to float32, an exponential computed in
#: float32, several inputs promoted to the widest, ``binary_cross_entropy`` refused; nothing cast that is not a
#: floating tensor on the device, or double), or the error's first words
AUTOCAST_CASES: dict[str, tuple[Callable[[], Any], str]] = {
    "mm, float16 by default": (_amp(lambda: _dev(4, 4) @ _dev(4, 4)), "torch.float16"),
    "linear, bfloat16": (_amp(lambda: torch.nn.functional.linear(_dev(2, 4), _dev(4, 4), _dev(4)), torch.bfloat16),
                         "torch.bfloat16"),
    "bmm": (_amp(lambda: torch.bmm(_dev(2, 3, 4), _dev(2, 4, 3)), torch.bfloat16), "torch.bfloat16"),
    "conv2d": (_amp(lambda: torch.nn.functional.conv2d(_dev(1, 2, 5, 5), _dev(3, 2, 3, 3)), torch.bfloat16),
               "torch.bfloat16"),
    "einsum": (_amp(lambda: torch.einsum("ij,jk->ik", _dev(2, 3), _dev(3, 2)), torch.bfloat16), "torch.bfloat16"),
    "scaled_dot_product_attention": (
        _amp(lambda: torch.nn.functional.scaled_dot_product_attention(_dev(1, 2, 4, 8), _dev(1, 2, 4, 8),
                                                                     _dev(1, 2, 4, 8)), torch.bfloat16),
        "torch.bfloat16"),
    "softmax of bfloat16": (_amp(lambda: _dev(4, 4, dtype=torch.bfloat16).softmax(-1), torch.bfloat16),
                            "torch.float32"),
    "softmax given its dtype": (_amp(lambda: _dev(4, 4, dtype=torch.bfloat16).softmax(-1, dtype=torch.bfloat16),
                                     torch.bfloat16), "torch.bfloat16"),
    "sum of float16": (_amp(lambda: _dev(4, 4, dtype=torch.float16).sum()), "torch.float32"),
    "cumsum of float16": (_amp(lambda: _dev(4, dtype=torch.float16).cumsum(0)), "torch.float32"),
    "exp of float16": (_amp(lambda: _dev(4, dtype=torch.float16).exp()), "torch.float32"),
    "pow of bfloat16": (_amp(lambda: _dev(4, dtype=torch.bfloat16).pow(2), torch.bfloat16), "torch.float32"),
    "layer_norm of bfloat16": (
        _amp(lambda: torch.nn.functional.layer_norm(_dev(2, 4, dtype=torch.bfloat16), (4,)), torch.bfloat16),
        "torch.float32"),
    "mse_loss of bfloat16": (
        _amp(lambda: torch.nn.functional.mse_loss(_dev(4, dtype=torch.bfloat16), _dev(4, dtype=torch.bfloat16)),
             torch.bfloat16), "torch.float32"),
    "norm of float16": (_amp(lambda: _dev(4, dtype=torch.float16).norm()), "torch.float32"),
    "norm over a dimension, by its overload": (
        _amp(lambda: torch.ops.aten.norm.ScalarOpt_dim(_dev(4, 4, dtype=torch.float16), 2, [0])), "torch.float32"),
    "addcmul promoted": (_amp(lambda: torch.addcmul(_dev(4, dtype=torch.float16), _dev(4),
                                                    _dev(4, dtype=torch.float16))), "torch.float32"),
    "addcmul of float16 alone": (_amp(lambda: torch.addcmul(*[_dev(4, dtype=torch.float16)] * 3)), "torch.float16"),
    "binary_cross_entropy refused": (
        _amp(lambda: torch.nn.functional.binary_cross_entropy(_dev(4), _dev(4))),
        "RuntimeError: torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast."),
    "binary_cross_entropy of host tensors": (
        _amp(lambda: torch.nn.functional.binary_cross_entropy(torch.full((4,), 0.5), torch.full((4,), 0.5))),
        "torch.float32"),
    "mm of host tensors": (_amp(lambda: torch.ones(4, 4) @ torch.ones(4, 4)), "torch.float32"),
    "mm of double": (_amp(lambda: _dev(4, 4, dtype=torch.float64) @ _dev(4, 4, dtype=torch.float64)),
                     "torch.float64"),
    "mul, not in the table": (_amp(lambda: _dev(4, dtype=torch.float16) * _dev(4)), "torch.float32"),
    "mm with autocast disabled inside": (_amp(_disabled_inside), "torch.float32"),
    "multi-head attention's output": (
        _amp(lambda: torch.nn.MultiheadAttention(16, 2, batch_first=True).cuda()(*[_dev(2, 3, 16)] * 3)[0],
             torch.bfloat16), "torch.bfloat16"),
    "multi-head attention's weights": (
        _amp(lambda: torch.nn.MultiheadAttention(16, 2, batch_first=True).cuda()(*[_dev(2, 3, 16)] * 3)[1],
             torch.bfloat16), "torch.float32"),
    "a transformer layer": (
        _amp(lambda: torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).cuda()(_dev(2, 3, 16)),
             torch.bfloat16), "torch.float32"),
    "cross_entropy of bfloat16 logits": (
        _amp(lambda: torch.nn.functional.cross_entropy(_dev(3, 10, dtype=torch.bfloat16),
                                                       torch.zeros(3, dtype=torch.long, device="cuda")),
             torch.bfloat16), "torch.float32"),
    "a float32 weight's gradient": (_linear_grad, "torch.float32"),
}


def autocast_outcome(name: str) -> str:
    """What ``AUTOCAST_CASES[name]``'s call gives: its result's dtype, or the exception's type and first line."""
    try:
        out = AUTOCAST_CASES[name][0]()
    except Exception as e:  # (its type and words are the outcome)
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return str(out.dtype)


def _sync_objects() -> dict[str, Any]:
    """What a sync-debug case calls on, made before the mode is set: ``x`` a device tensor of ones, ``p`` a pinned and
    ``h`` a pageable host tensor of its shape, ``s`` a side stream, ``ev`` an event recorded on the current one, ``m``
    a 4 x 4 identity on the device."""
    x = torch.ones(8, device="cuda")
    ev = torch.cuda.Event()
    ev.record()
    return {"x": x, "p": torch.empty(8, pin_memory=True), "h": torch.empty(8), "s": torch.cuda.Stream(), "ev": ev,
            "m": torch.eye(4, device="cuda")}


#: calls under ``torch.cuda.set_sync_debug_mode``, each of :func:`_sync_objects`'s, and whether a GPU flags it as "a
#: synchronizing CUDA operation" (c10's ``memcpy_and_sync`` and ``stream_synchronize``: a value read on the host, a
#: blocking copy either way, an output sized by values, ``Stream.synchronize()``) or not (a non-blocking copy,
#: ``torch.cuda.synchronize()`` and an event's ``synchronize()``, which call CUDA directly; a kernel)
SYNC_DEBUG_CASES: dict[str, tuple[Callable[[dict[str, Any]], Any], bool]] = {
    "item": (lambda o: o["x"].sum().item(), True),
    "float of a 0-d tensor": (lambda o: float(o["x"][0]), True),
    "bool of a 0-d tensor": (lambda o: bool(o["x"].any()), True),
    "tolist": (lambda o: o["x"].tolist(), True),
    "cpu()": (lambda o: o["x"].cpu(), True),
    "to('cpu', non_blocking=True)": (lambda o: o["x"].to("cpu", non_blocking=True), False),
    "D2H copy_ into pinned, non_blocking": (lambda o: o["p"].copy_(o["x"], non_blocking=True), False),
    "D2H copy_ into pageable, non_blocking": (lambda o: o["h"].copy_(o["x"], non_blocking=True), False),
    "D2H copy_ into pinned, blocking": (lambda o: o["p"].copy_(o["x"]), True),
    "H2D copy_ from pageable, blocking": (lambda o: o["x"].copy_(o["h"]), True),
    "H2D copy_ from pinned, non_blocking": (lambda o: o["x"].copy_(o["p"], non_blocking=True), False),
    "H2D copy_ from pageable, non_blocking": (lambda o: o["x"].copy_(o["h"], non_blocking=True), False),
    "torch.tensor(data, device='cuda')": (lambda o: torch.tensor([1.0, 2.0], device="cuda"), True),
    "nonzero": (lambda o: o["x"].nonzero(), True),
    "a boolean mask's index": (lambda o: o["x"][o["x"] > 0], True),
    "unique": (lambda o: torch.unique(o["x"]), True),
    "a host index": (lambda o: o["x"][torch.tensor([0, 2])], True),
    "equal": (lambda o: torch.equal(o["x"], o["x"] * 1), True),
    "equal of a tensor and itself": (lambda o: torch.equal(o["x"], o["x"]), False),  # (no kernel: ATen's alias check)
    "equal of two shapes": (lambda o: torch.equal(o["x"], o["x"][:4]), False),
    "Stream.synchronize()": (lambda o: o["s"].synchronize(), True),
    "current_stream().synchronize()": (lambda o: torch.cuda.current_stream().synchronize(), True),
    "Event.synchronize()": (lambda o: o["ev"].synchronize(), False),
    "torch.cuda.synchronize()": (lambda o: torch.cuda.synchronize(), False),
    "a kernel": (lambda o: o["x"] * 2, False),
    "Stream.query()": (lambda o: o["s"].query(), False),
    "linalg.ldl_factor_ex (cuSOLVER's own wait)": (lambda o: torch.linalg.ldl_factor_ex(o["m"]), False),
    "H2D of no elements, blocking": (lambda o: torch.empty(0).cuda(), False),  # (ATen's copy_ returns at once)
    "D2H of no elements, blocking": (lambda o: o["x"][:0].cpu(), False),
}


def sync_debug_outcome(name: str, mode: str) -> str:
    """What ``SYNC_DEBUG_CASES[name]``'s call does under ``torch.cuda.set_sync_debug_mode(mode)``: "flagged" where it
    warns ("warn") or raises ("error") that it synchronizes, "not flagged" where it does neither, or another error's
    type and first line. The mode is off again after."""
    objects = _sync_objects()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode(mode)
        try:
            SYNC_DEBUG_CASES[name][0](objects)
        except RuntimeError as e:
            if "called a synchronizing CUDA operation" in str(e) and mode == "error":
                return "flagged"
            return f"{type(e).__name__}: {str(e).splitlines()[0]}"
        finally:
            torch.cuda.set_sync_debug_mode(0)
    flagged = [w for w in seen if "called a synchronizing CUDA operation" in str(w.message)]
    return "flagged" if flagged and mode == "warn" else "not flagged"


#: factories asked to pin (``pin_memory``), each made from a device tensor ``a`` where it takes one, and what a GPU
#: gives: ATen's error for a device tensor (``empty_cuda`` refuses to pin), else the made tensor's device type and
#: whether it is pinned
PIN_FACTORIES: dict[str, tuple[Any, Any]] = {
    "empty": (lambda a: torch.empty(4, device="cuda", pin_memory=True), "Only dense CPU tensors can be pinned"),
    "zeros": (lambda a: torch.zeros(4, device="cuda", pin_memory=True), "Only dense CPU tensors can be pinned"),
    "full": (lambda a: torch.full((4,), 1.0, device="cuda", pin_memory=True), "Only dense CPU tensors can be pinned"),
    "empty_like": (lambda a: torch.empty_like(a, pin_memory=True), "Only dense CPU tensors can be pinned"),
    "ones_like": (lambda a: torch.ones_like(a, pin_memory=True), "Only dense CPU tensors can be pinned"),
    "empty, not pinned": (lambda a: torch.empty(4, device="cuda", pin_memory=False), ("cuda", False)),
    "host empty": (lambda a: torch.empty(4, pin_memory=True), ("cpu", True)),
    "host zeros_like": (lambda a: torch.zeros_like(a, device="cpu", pin_memory=True), ("cpu", True)),
    # a copy of a device tensor to the host: pinned where it is non-blocking (ATen's _to_copy pins its output then,
    # whatever ``pin_memory`` says), pageable where only ``pin_memory`` asks
    "_to_copy asked to pin": (lambda a: torch.ops.aten._to_copy(a, device="cpu", pin_memory=True), ("cpu", False)),
    "_to_copy non-blocking": (lambda a: torch.ops.aten._to_copy(a, device="cpu", non_blocking=True), ("cpu", True)),
}


def pin_factory_outcome(name: str) -> Any:
    """What ``PIN_FACTORIES[name]``'s call gives, run in the current process: the error's text, or the tensor's
    device type and whether it is pinned."""
    make = PIN_FACTORIES[name][0]
    a = torch.ones(4, device="cuda")
    try:
        t = make(a)
    except RuntimeError as e:
        return str(e).splitlines()[0]
    return (t.device.type, t.is_pinned())


#: calls on a device tensor (``d``: ones, 4 x 4) that a GPU refuses, and one it takes, each made on a stream behind a
#: long kernel: (the exception's type, the start of its message, whether that stream had finished when the call
#: returned or raised). An error of the arguments is raised at the call, before anything is launched (the stream is
#: still busy); one CUDA's implementation reads on the host (a factorization's ``info``) is raised once the host has
#: waited for the stream
ERRORS_AT_THE_CALL: dict[str, tuple[Any, tuple[str, str, bool]]] = {
    "linalg.cholesky of a matrix not positive-definite": (
        lambda d: torch.linalg.cholesky(d),
        ("_LinAlgError", "linalg.cholesky: The factorization could not be completed", True)),
    "cholesky of a matrix not positive-definite": (
        lambda d: torch.cholesky(d), ("_LinAlgError", "cholesky: The factorization could not be completed", True)),
    "bitwise_and of floats": (
        lambda d: d.bitwise_and(d), ("NotImplementedError", "\"bitwise_and_cuda\" not implemented for 'Float'", False)),
    "bincount of floats": (
        lambda d: torch.bincount(d.flatten()),
        ("NotImplementedError", "\"bincount_cuda\" not implemented for 'Float'", False)),
    "conv1d of a 2-d weight": (
        lambda d: torch.nn.functional.conv1d(d, d), ("RuntimeError", "weight should have at least three dimensions",
                                                    False)),
    "nll_loss of a 2-d host target": (
        lambda d: torch.nn.functional.nll_loss(d, torch.ones(4, 4)),
        ("RuntimeError", "Expected all tensors to be on the same device, but got target is on cpu", False)),
    "histogram (no CUDA kernel)": (
        lambda d: torch.histogram(d, bins=4),
        ("NotImplementedError", "Could not run 'aten::histogram.bin_ct' with arguments from the 'CUDA' backend",
         False)),
    "randint_like from 0 to 0": (
        lambda d: torch.randint_like(d, 0, 0), ("RuntimeError", "random_ expects 'from' to be less than 'to'", False)),
    # in-place: the first call of an op on a destination is tried for its argument errors (an H100 raised each at the
    # call: docs/confirmations.md, fifty-first run's sweep)
    "bitwise_and_ of floats": (
        lambda d: d.bitwise_and_(d), ("NotImplementedError", "\"bitwise_and_cuda\" not implemented for 'Float'",
                                      False)),
    "clamp_ with no bound": (
        lambda d: d.clamp_(), ("RuntimeError", "torch.clamp: At least one of 'min' or 'max' must not be None", False)),
    "fill_ of a 1-d value": (
        lambda d: d.fill_(d[0]), ("RuntimeError", "fill_ only supports 0-dimension value tensor", False)),
    "cholesky_inverse of a factor (taken)": (
        lambda d: torch.cholesky_inverse(torch.eye(4, device=d.device) * 2), ("ok", "", False)),
}


def error_at_the_call_outcome(name: str) -> tuple[str, str, bool]:
    """What ``ERRORS_AT_THE_CALL[name]``'s call gives, run in the current process on a side stream behind a kernel
    of about 100 ms (after a first call, the device idle): the exception's type name and its message cut to the
    expectation's length (``ok``, empty, where it returns), and whether the side stream had finished then."""
    call, (_, message, _) = ERRORS_AT_THE_CALL[name]
    d = torch.ones(4, 4, device="cuda")
    s = torch.cuda.Stream()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.cholesky's deprecation)
        # once before, the device idle: a kernel's first launch loads its module, which waits for the device (an
        # H100 waited for a first ``torch.eye``); the warm-up's outcome is not the one asked for
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), contextlib.suppress(Exception):
            call(d)
        torch.cuda.synchronize()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.cuda._sleep(200_000_000)
            try:
                call(d)
            except Exception as e:  # (its type is the outcome)
                return type(e).__name__, str(e)[:len(message)], s.query()
    done = s.query()
    s.synchronize()
    return "ok", "", done


# -- common modules whose CPU kernels shape some results otherwise than CUDA's (docs/dropin.md) ----------------------
# ``MODULE_PROGRAMS[name](dev)`` on "cpu" and on "cuda" (the simulator's or a GPU's) give the same results:
# tests/property/dropin/test_common_modules_run_as_on_a_gpu.py and tests/gpu/test_dropin_gpu.py


def _values(dev: str, *shape: int) -> torch.Tensor:
    n = 1
    for k in shape:
        n *= k
    return (torch.arange(float(n), device=dev).reshape(shape) ** 1.5).sin()  # (the same values on both devices)


def batch_norm(dev: str) -> dict[str, Any]:
    bn = nn.BatchNorm1d(3).to(dev)
    x = _values(dev, 4, 3)
    z = bn(x)
    (z * z).sum().backward()  # (the input needs no gradient: its backward's first result is not asked for)
    bn.eval()
    return {"z": z, "weight grad": bn.weight.grad, "bias grad": bn.bias.grad, "running mean": bn.running_mean,
            "eval": bn(x)}


def embedding_bag(dev: str) -> dict[str, Any]:
    torch.manual_seed(0)
    out: dict[str, Any] = {}
    for mode in ("sum", "mean", "max"):
        for last in (False, True):
            bag = nn.EmbeddingBag(10, 3, mode=mode, include_last_offset=last).to(dev)
            offsets = torch.tensor([0, 2, 2, 5] if last else [0, 2, 2], device=dev)
            y = bag(torch.tensor([1, 2, 4, 5, 4], device=dev), offsets)
            (y * torch.arange(3.0, device=dev)).sum().backward()
            out[f"{mode} {last}"] = (y, bag.weight.grad)
    bag = nn.EmbeddingBag(10, 3).to(dev)
    y = bag(torch.tensor([[1, 2], [4, 1]], device=dev))  # (a 2-d input: a bag per row)
    y.sum().backward()
    out["rows"] = (y, bag.weight.grad)
    return out


def packed_sequences(dev: str) -> dict[str, Any]:
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 4).to(dev)
    x = _values(dev, 5, 2, 3).requires_grad_()
    packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([5, 3]), enforce_sorted=True)
    o, (h, _) = lstm(packed)
    y, lengths = nn.utils.rnn.pad_packed_sequence(o)
    (y * y).sum().backward()
    gru = nn.GRU(3, 4, bidirectional=True).to(dev)
    o2, _ = gru(nn.utils.rnn.pack_sequence([_values(dev, 4, 3), _values(dev, 2, 3) * 2], enforce_sorted=False))
    y2, lengths2 = nn.utils.rnn.pad_packed_sequence(o2, batch_first=True)
    return {"y": y, "h": h, "input grad": x.grad, "weight grad": lstm.weight_hh_l0.grad, "bidirectional": y2,
            # (host tensors on a GPU too: the sizes a packed sequence is cut by)
            "batch sizes": (packed.batch_sizes.device.type, packed.batch_sizes.tolist()),
            "lengths": (lengths.device.type, lengths.tolist(), lengths2.device.type, lengths2.tolist())}


def module_on_the_host(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, tuple):
        return tuple(module_on_the_host(v) for v in x)
    return x


def same_module_results(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and torch.allclose(a, b, rtol=1e-3, atol=1e-4)  # (a GPU rounds otherwise)
    if isinstance(a, tuple):
        return all(same_module_results(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


MODULE_PROGRAMS = {"batch_norm": batch_norm, "embedding_bag": embedding_bag, "packed_sequences": packed_sequences}
