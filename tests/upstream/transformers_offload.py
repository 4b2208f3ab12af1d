"""Hugging Face transformers' real offloaded KV cache (``DynamicCache(offloading=True)``, transformers from PyPI,
unmodified) in a decode loop.

``decode(steps, full, sliding, static)`` is plain torch.cuda code: a stack of ``full`` full-attention layers and
``sliding`` sliding-window ones (a Gemma 3 text config's layer types, the sliding ones first), each step's keys and
values added through ``cache.update`` and attended to on the device (with ``static``, a ``StaticCache`` of as many
positions as the loop writes, the same protocol); it asserts each step's output equals the same loop
on the host with an unoffloaded cache. The cache offloads each full-attention layer to pinned memory after its
update (a non-blocking D2H on the compute stream) and prefetches the next offloaded one back on a stream of its own
(``prefetch_stream``) at the start of each update, after the compute stream waits for that stream.

``decode_without_prefetch_wait`` runs the same loop with one of the cache's synchronizations made a no-op on the
cache's own stream object (nothing of transformers is copied or edited): the prefetch stream's wait for the compute
stream before it prefetches.

    simdevice check tests/upstream/transformers_offload.py::decode                 # clean: two offloaded layers
    simdevice check "tests/upstream/transformers_offload.py::decode:full=1"        # found: one offloaded layer

``generate(new, layers)``: a tiny Llama generating with ``cache_implementation="offloaded"``, the same cache through
the model's own attention, compared with the host's tokens; ``generate_loaded``: the same model saved and loaded
with ``from_pretrained(path, device_map="cuda")``.
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch
from transformers import Gemma3TextConfig, LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import Cache, DynamicCache, StaticCache

HEADS, DIM, WINDOW, PROMPT = 2, 16, 8, 4


def _cache(full: int, sliding: int, offloading: bool, static: int = 0) -> Cache:
    """A ``DynamicCache``, or with ``static`` a ``StaticCache`` of that many positions (preallocated, written in
    place with ``index_copy_``)."""
    config = Gemma3TextConfig(num_hidden_layers=full + sliding, sliding_window=WINDOW,
                              layer_types=["sliding_attention"] * sliding + ["full_attention"] * full,
                              num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=DIM, hidden_size=32,
                              intermediate_size=64, vocab_size=128)
    if static:
        return StaticCache(config=config, max_cache_len=static, offloading=offloading)
    return DynamicCache(config=config, offloading=offloading)


def _loop(cache: Cache, steps: int, layers: int, device: str) -> list[torch.Tensor]:
    """Each step: a query through every layer, its keys and values added to the cache and attended to. The inputs
    are made on the host and moved once, and the outputs read once at the end, as a model computes its keys and
    values on the device: nothing in the loop makes the host wait for the device."""
    g = torch.Generator().manual_seed(0)
    prompt = PROMPT  # (a prompt of 4 tokens, then one token a step)
    tokens = prompt + steps - 1
    qs = torch.randn(tokens, HEADS, DIM, generator=g).to(device)
    ks = torch.randn(layers, tokens, HEADS, DIM, generator=g).to(device)
    vs = torch.randn(layers, tokens, HEADS, DIM, generator=g).to(device)
    outs = []
    for step in range(steps):
        span = slice(0, prompt) if step == 0 else slice(prompt + step - 1, prompt + step)
        q = qs[span].transpose(0, 1).unsqueeze(0)  # (1, heads, tokens of the step, dim)
        for layer in range(layers):
            k, v = cache.update(ks[layer, span].transpose(0, 1).unsqueeze(0),
                                vs[layer, span].transpose(0, 1).unsqueeze(0), layer)
            k, v = k[:, :, : span.stop], v[:, :, : span.stop]  # (a static cache's positions not yet written: left out)
            q = (q @ k.transpose(-1, -2) / DIM**0.5).softmax(-1) @ v
        outs.append(q)
    return [out.cpu() for out in outs]


def _check(cache: Cache, steps: int, full: int, sliding: int, static: bool) -> None:
    expected = _loop(_cache(full, sliding, False, _positions(steps, static)), steps, full + sliding, "cpu")
    got = _loop(cache, steps, full + sliding, "cuda")
    for step, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert torch.allclose(a, b, atol=1e-5), f"step {step}: the attention read a layer's cache wrong"


def _positions(steps: int, static: bool) -> int:
    return PROMPT + steps - 1 if static else 0


def decode(steps: int = 3, full: int = 2, sliding: int = 1, static: bool = False) -> None:
    _check(_cache(full, sliding, True, _positions(steps, static)), steps, full, sliding, static)


def decode_without_prefetch_wait(steps: int = 3, full: int = 2, sliding: int = 1, static: bool = False) -> None:
    """The prefetch stream's ``wait_stream`` on the compute stream made a no-op (its wait on other streams kept)."""
    cache = _cache(full, sliding, True, _positions(steps, static))
    stream: Any = cache.prefetch_stream
    real, compute = stream.wait_stream, torch.cuda.default_stream()

    def wait_stream(other: Any) -> None:
        if other != compute:
            real(other)

    stream.wait_stream = wait_stream
    _check(cache, steps, full, sliding, static)


def _llama(device: str, layers: int, attention: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation=attention)
    return LlamaForCausalLM(config).to(device).eval()


def generate(new: int = 3, layers: int = 2, attention: str = "sdpa") -> None:
    """A tiny Llama (random weights) generating greedily with the offloaded cache
    (``cache_implementation="offloaded"``: a ``DynamicCache(offloading=True)``), as a user asks for it; the tokens
    must be the host's, generated with the default cache. ``attention``: the model's attention implementation
    (``"sdpa"``, transformers' default, or ``"eager"``)."""
    ids = torch.tensor([[1, 5, 9, 3]])
    expected = _llama("cpu", layers, attention).generate(ids, max_new_tokens=new, do_sample=False)
    got = _llama("cuda", layers, attention).generate(ids.to("cuda"), max_new_tokens=new, do_sample=False,
                                                     cache_implementation="offloaded")
    assert torch.equal(got.cpu(), expected), "the model generated other tokens with the offloaded cache"


def generate_loaded(new: int = 3, layers: int = 2) -> None:
    """``generate`` of the tiny Llama saved, then loaded as users load one, ``from_pretrained(path,
    device_map="cuda")``: transformers moves each weight to the device in a worker of a ``ThreadPoolExecutor`` it
    made through a name bound at import. (``use_kernels=False``: with the ``kernels`` package installed,
    transformers would fetch CUDA kernels from the Hub for a model on "cuda".)"""
    ids = torch.tensor([[1, 5, 9, 3]])
    host = _llama("cpu", layers, "eager")
    expected = host.generate(ids, max_new_tokens=new, do_sample=False)
    with tempfile.TemporaryDirectory() as path:
        host.save_pretrained(path)
        model = LlamaForCausalLM.from_pretrained(path, device_map="cuda", use_kernels=False,
                                                 attn_implementation="eager")
    assert all(p.is_cuda for p in model.parameters())
    got = model.generate(ids.to("cuda"), max_new_tokens=new, do_sample=False, cache_implementation="offloaded")
    assert torch.equal(got.cpu(), expected), "the model generated other tokens with the offloaded cache"
