"""The model's shape as the agent reports it: N and E from its parameters, layers, width, sequence length and experts
from its config, the device it trains on and the data-parallel degree of its DDP/FSDP wrapper.

Everything here reads attributes and tensor metadata only: it never reads a tensor's values, never calls a
``torch.cuda`` function that could create a CUDA context, and never imports torch or a framework itself.
"""

from __future__ import annotations

import os
import sys

#: Config keys, in the order they are tried: Hugging Face names first, then nanoGPT-style dataclasses.
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
WIDTH_KEYS = ("hidden_size", "n_embd", "d_model", "dim", "embed_dim")
SEQ_KEYS = ("max_position_embeddings", "n_positions", "block_size", "max_seq_len", "seq_len", "n_ctx")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
MOE_WARNING = "total parameters overstate FLOPs; declare the active parameters with --params"


def unwrap(module: object) -> list[object]:
    """The module and what it wraps: torch.compile's ``_orig_mod``, DDP/FSDP's ``module``, FSDP1's inner module."""
    chain = [module]
    for _ in range(8):
        children = getattr(module, "__dict__", {}).get("_modules") or {}
        inner = next(
            (
                children[a]
                for a in ("_orig_mod", "_fsdp_wrapped_module", "module")
                if children.get(a) is not None
            ),
            None,
        )
        if inner is None or any(inner is seen for seen in chain):
            break
        chain.append(inner)
        module = inner
    return chain


def _storage_key(param) -> object:
    """Identifies the memory behind a parameter, so weights tied by sharing storage count once."""
    try:
        pointer = param.untyped_storage().data_ptr()
    except Exception:  # DTensor, meta and other storage-less tensors: identity is all there is
        return id(param)
    if pointer == 0:
        return id(param)
    return (pointer, param.storage_offset(), tuple(param.shape), tuple(param.stride()))


def count_params(root, extra: tuple | list = ()) -> tuple[int | None, int | None, str | None]:
    """(N, E, why not): N counts each shared storage once; E is the lookup-only embedding tables.

    An embedding whose weight is also a parameter of another kind of module (a tied output head) is a matmul
    weight too, so it stays in N - E. ``extra`` parameters (stepped by the optimizer, of no module seen) count in N;
    not knowing their module, tm cannot call them lookups.
    """
    torch_nn = sys.modules.get("torch.nn")
    embedding_types = tuple(
        t for t in (getattr(torch_nn, "Embedding", None), getattr(torch_nn, "EmbeddingBag", None)) if t
    )
    owners: dict[object, set[bool]] = {}  # storage -> {owned by an embedding?}
    sizes: dict[object, int] = {}
    for module in root.modules():
        is_embedding = isinstance(module, embedding_types)
        for param in module._parameters.values():
            if param is None:
                continue
            if type(param).__name__ == "FlatParameter":
                return None, None, "FSDP flat parameters hide the model's parameter count: pass --params"
            key = _storage_key(param)
            owners.setdefault(key, set()).add(is_embedding)
            sizes[key] = param.numel()
    for param in extra:
        if type(param).__name__ == "FlatParameter":
            return None, None, "FSDP flat parameters hide the model's parameter count: pass --params"
        key = _storage_key(param)
        if key not in owners:
            owners[key] = {False}
            sizes[key] = param.numel()
    n_params = sum(sizes.values())
    embedding = sum(sizes[key] for key, kinds in owners.items() if kinds == {True})
    return n_params, embedding, None


def find_config(root) -> object | None:
    """The first ``config`` attribute on the model, the modules it wraps, or their direct children."""
    chain = unwrap(root)
    for module in chain:
        config = getattr(module, "__dict__", {}).get("config")
        if config is not None:
            return config
    for module in chain:
        for child in getattr(module, "_modules", {}).values():
            config = getattr(child, "__dict__", {}).get("config") if child is not None else None
            if config is not None:
                return config
    return None


def config_int(config: object, keys: tuple[str, ...]) -> tuple[str, int] | None:
    """(key, value) of the first key the config holds as a positive int."""
    for key in keys:
        if isinstance(config, dict):
            value = config.get(key)
        else:
            try:
                value = getattr(config, key, None)
            except Exception:
                value = None
        if type(value) is int and value > 0:
            return key, value
    return None


def device_of(root) -> dict | None:
    """``{"type", "index", "uuid", "dtype", "threads"}`` of the model's first parameter, without creating a CUDA
    context. ``dtype`` is what its matmuls compute in (autocast's dtype where autocast is on, as it is in the forward
    that adopts the model, else the parameter's); ``threads`` is torch's intra-op thread count. A peak measured with
    ``tm peak`` scores the run only where both match the peak's."""
    for param in root.parameters():
        device = param.device
        uuid = None
        if device.type == "cuda" and device.index is not None:
            cuda = sys.modules.get("torch.cuda")
            # Only where CUDA is already initialised (the parameters live there): the query then opens nothing new.
            if cuda is not None and cuda.is_initialized():
                try:
                    uuid = "GPU-" + str(cuda.get_device_properties(device.index).uuid)
                except Exception:
                    uuid = None
        dtype, threads = compute_basis(device.type, param.dtype)
        return {"type": device.type, "index": device.index, "uuid": uuid, "dtype": dtype, "threads": threads}
    return None


def compute_basis(device_type: str, param_dtype) -> tuple[str | None, int | None]:
    """(the dtype matmuls run in, torch's intra-op threads), each None where torch cannot say."""
    torch = sys.modules.get("torch")
    dtype = param_dtype
    threads = None
    try:
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
    except Exception:
        pass  # a torch without the per-device autocast queries: the parameters' dtype
    try:
        threads = int(torch.get_num_threads())
    except Exception:
        threads = None
    name = str(dtype).removeprefix("torch.") if dtype is not None else None
    return name, threads


def env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def world_size() -> int | None:
    """WORLD_SIZE as torchrun sets it, else the default process group's size if the loop initialised one."""
    size = env_int("WORLD_SIZE")
    if size is not None:
        return size
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
    except Exception:
        return None
    return None


def _group_size(group) -> int | None:
    try:
        return int(group.size())
    except Exception:
        return None


def data_parallel_degree(root) -> tuple[int | None, str]:
    """(dp, how it was found); dp None when ranks exist but no DDP/FSDP wrapper says how they split the data."""
    ddp_module = sys.modules.get("torch.nn.parallel.distributed")
    ddp_class = getattr(ddp_module, "DistributedDataParallel", None)
    fsdp_module = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    fsdp_class = getattr(fsdp_module, "FullyShardedDataParallel", None)
    fsdp2_module = sys.modules.get("torch.distributed.fsdp._fully_shard._fully_shard")
    fsdp2_class = getattr(fsdp2_module, "FSDPModule", None)
    for module in unwrap(root):
        if ddp_class is not None and isinstance(module, ddp_class):
            size = _group_size(getattr(module, "process_group", None))
            if size is not None:
                return size, "DistributedDataParallel's process group"
        if fsdp_class is not None and isinstance(module, fsdp_class):
            size = _group_size(getattr(module, "process_group", None))
            inter = _group_size(getattr(module, "_inter_node_pg", None))
            if size is not None:
                return size * (inter or 1), "FullyShardedDataParallel's process group"
        if fsdp2_class is not None and isinstance(module, fsdp2_class):
            for param in module.parameters():
                mesh = getattr(param, "device_mesh", None)
                if mesh is not None and getattr(mesh, "ndim", 0) == 1:
                    return int(mesh.size()), "fully_shard's device mesh"
                break
    size = world_size()
    if size is None or size == 1:
        return 1, "a single process"
    return None, f"{size} ranks but no DistributedDataParallel or FSDP wrapper around the model: pass --dp"


def shape_facts(root, extra: tuple | list = (), whose: str = "") -> list[tuple[str, object, dict]]:
    """(name, value, extra Fact fields) for N, E, layers, d_model, seq_len and experts; absent ones are skipped.

    ``extra``: parameters of the model outside ``root`` (``count_params``); ``whose``: what the model is, where it is
    not the module first called (``_model_owner.py``), added to the notes of N and E."""
    facts: list[tuple[str, object, dict]] = []
    n_params, embedding, why = count_params(root, extra)
    if n_params is None:
        facts.append(("params", None, {"note": why}))
    else:
        facts.append(("params", n_params, {"note": "each shared storage counted once" + whose}))
        facts.append(
            (
                "embedding_params",
                embedding,
                {"note": "nn.Embedding tables used only as lookups (a tied head stays in N-E)" + whose},
            )
        )
    config = find_config(root)
    if config is None:
        return facts
    for name, keys in (("layers", LAYER_KEYS), ("d_model", WIDTH_KEYS), ("seq_len", SEQ_KEYS)):
        found = config_int(config, keys)
        if found is not None:
            facts.append((name, found[1], {"note": f"model config {type(config).__name__}.{found[0]}"}))
    experts = config_int(config, EXPERT_KEYS)
    if experts is not None and experts[1] > 1:
        facts.append(
            ("moe_experts", experts[1], {"note": f"model config {experts[0]}", "warning": MOE_WARNING})
        )
    return facts
