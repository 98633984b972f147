"""Pixel size -> latent size for generation, with errors that name sizes that work.

A requested ``frames x height x width`` must fit three things: the tokenizer's compression (e.g. 4x8x8,
causal: ``frames = 1 + 4k``), the model's patch size (latent height/width multiples of the patch), and
the split of the video tokens over ``cp * tp`` ranks.
"""

from __future__ import annotations


def _tokens(thw, patch) -> int:
    return (thw[0] // patch[0]) * (thw[1] // patch[1]) * (thw[2] // patch[2])


def check_latent_size(latent_thw, patch_size, token_split: int = 1, tokenizer=None) -> None:
    """Raise ``ValueError`` when latents ``(t, h, w)`` do not divide into patches or into ``token_split``
    equal token slices; the message names nearby sizes that work (in pixels when ``tokenizer`` is given)."""
    t, h, w = latent_thw
    pt, ph, pw = patch_size

    def px(tt, hh, ww):
        return tokenizer.pixel_shape(tt, hh, ww) if tokenizer is not None else (tt, hh, ww)

    unit = "pixels" if tokenizer is not None else "latents"
    bad = []
    if t % pt:
        lo = max(pt, t // pt * pt)
        bad.append(f"latent frames {t} must be a multiple of the patch {pt} (frames that work: "
                   f"{px(lo, h, w)[0]} or {px(lo + pt, h, w)[0]})")
    for name, n, p, axis in (("height", h, ph, 1), ("width", w, pw, 2)):
        if n % p:
            ok = sorted({max(p, n // p * p), n // p * p + p})
            sizes = [px(t, x, w)[1] if axis == 1 else px(t, h, x)[2] for x in ok]
            bad.append(f"latent {name} {n} must be a multiple of the patch {p} ({name}s that work: "
                       f"{' or '.join(map(str, sizes))} {unit})")
    if bad:
        raise ValueError("cannot generate this size: " + "; ".join(bad))
    n = _tokens(latent_thw, patch_size)
    if token_split > 1 and n % token_split:
        frames = [tt for tt in range(max(pt, t - 8 * pt), t + 8 * pt + 1, pt)
                  if _tokens((tt, h, w), patch_size) % token_split == 0]
        frames = sorted(frames, key=lambda tt: abs(tt - t))[:2]
        sides = [hh for hh in range(max(ph, h - 16 * ph), h + 16 * ph + 1, ph)
                 if _tokens((t, hh, w), patch_size) % token_split == 0]
        sides = sorted(sides, key=lambda hh: abs(hh - h))[:2]
        hints = []
        if frames:
            hints.append("frames " + " or ".join(str(px(tt, h, w)[0]) for tt in sorted(frames)))
        if sides:
            hints.append("height " + " or ".join(str(px(t, hh, w)[1]) for hh in sorted(sides)))
        T, H, W = px(t, h, w)
        raise ValueError(f"{T}x{H}x{W} ({unit}) gives {n} video tokens, which do not split evenly over "
                         f"cp*tp = {token_split} ranks; sizes that work: {', '.join(hints) or 'none nearby'} "
                         f"(or change --cp/--tp)")


def latent_size(tokenizer, frames: int, height: int, width: int, patch_size, token_split: int = 1,
                ) -> tuple[int, int, int]:
    """``(t, h, w)`` latents for a ``frames x height x width`` video, checked against the tokenizer's
    compression, the patch size and ``token_split``; raises ``ValueError`` naming sizes that work."""
    thw = tokenizer.latent_shape(frames, height, width)  # names sizes that fit the compression
    check_latent_size(thw, patch_size, token_split, tokenizer)
    return thw


def free_memory(device) -> int | None:
    """Bytes free on ``device`` (CUDA: the driver's count; CPU: ``MemAvailable``), the least over all ranks when
    distributed (every rank takes the same decision); None when unknown."""
    import torch
    import torch.distributed as dist

    device = torch.device(device)
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        try:
            with open("/proc/meminfo") as f:
                free = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
        except (OSError, StopIteration, ValueError):
            free = -1
    if dist.is_initialized() and dist.get_world_size() > 1:  # every rank calls this: one all-reduce
        t = torch.tensor([float(free if free >= 0 else 2**62)], dtype=torch.float64,
                         device=device if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        free = int(t.item()) if t.item() < 2**62 else -1
    return free if free >= 0 else None


def check_memory(pixel_thw, latent_thw, patch_size, hidden_size: int, batch: int, device, dtype_bytes: int = 4,
                 copies: int = 1, token_split: int = 1) -> None:
    """Raise ``ValueError`` before anything is allocated when a lower bound of the memory that generation needs on
    ``device`` exceeds what is free: the decoded float32 videos (``batch x 3 x T x H x W``), or the hidden states of
    one transformer block (``batch x copies`` sequences, CFG counting twice, of this rank's tokens x ``hidden_size``)."""
    T, H, W = pixel_thw
    tokens = _tokens(latent_thw, patch_size)
    need = max(batch * 3 * T * H * W * 4, batch * copies * -(-tokens // token_split) * hidden_size * dtype_bytes)
    free = free_memory(device)
    if free is not None and need > free:
        raise ValueError(f"{batch} video(s) of {T}x{H}x{W} px ({tokens:,} video tokens each) need at least "
                         f"{need / 2**30:,.1f} GiB on {device}, but {free / 2**30:,.1f} GiB are free; lower --height / "
                         f"--width / --frames or --batch-size")
