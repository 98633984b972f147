"""``vfm prepare``: clips (a folder of videos/images + captions, or webdataset shards) -> Energon shards.

    vfm prepare input=raw_clips/ output=data/prepared tokenizer=identity tokenizer.spatial_compression=2 \\
        text_encoder=hash text_encoder.dim=64 samples_per_shard=256 max_frames=33
    torchrun --nproc-per-node 8 -m nemo_vfm.cli.main prepare input=... output=...

Arguments are ``key=value``; ``tokenizer.X=V`` / ``text_encoder.X=V`` pass constructor arguments to the
named tokenizer / text encoder. Values are parsed as JSON when they can be (``8``, ``true``, ``[1,2,2]``).
Re-running with the same output resumes; failed inputs are listed in ``OUTPUT/.prepare/report.json``.
``clip_pooled=DIR`` also stores each caption's pooled CLIP text embedding (a CLIP text encoder folder or a Kandinsky 6
pipeline folder with text_encoder_2/), as Kandinsky 6 trains on it. ``image_condition=wan_i2v`` also stores each
clip's first-frame latents for Wan image-to-video fine-tuning
(``lora_wan2_2_i2v_a14b``): ``vfm prepare input=clips/ output=data/wan_i2v tokenizer=wan tokenizer.path=WAN_DIR
text_encoder=umt5 text_encoder.path=WAN_DIR image_condition=wan_i2v``.
LTX-2 (audio + video, ``lora_ltx2``): ``vfm prepare input=clips/ output=data/ltx2_prepared tokenizer=ltx2
tokenizer.path=LTX2_DIR text_encoder=ltx2 text_encoder.path=LTX2_DIR text_encoder.device=cuda audio_vae=LTX2_DIR
patch_multiple=[1,1,1] device=cuda``
(``missing_audio=skip|video_only|error`` for clips without an audio track, ``skip`` by default).
LTX-2 IC-LoRA (``lora_ltx2_ic``): add ``reference_dir=REFS reference_downscale=K`` (the reference of
``clips/<sub>/<stem>.mp4`` is ``REFS/<sub>/<stem>.<ext>``; ``missing_reference=skip|error``, ``skip`` by default).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

ACCEPTS_EXTRA = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="input=DIR output=DIR tokenizer=NAME text_encoder=NAME samples_per_shard=N max_frames=N "
                             "height=H width=W patch_multiple=[1,2,2] latent_dtype=float16 allow_missing_caption=true "
                             "image_condition=wan_i2v audio_vae=DIR missing_audio=skip|video_only|error device=cuda "
                             "index=true progress=true; tokenizer.K=V and "
                             "text_encoder.K=V for their kwargs")


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse(pairs: list[str]):
    from nemo_vfm.data.prepare import PrepareConfig

    fields = {f.name for f in dataclasses.fields(PrepareConfig)}
    kw: dict = {"tokenizer_kwargs": {}, "text_encoder_kwargs": {}}
    for pair in pairs:
        key, sep, val = pair.partition("=")
        key = key.lstrip("-").replace("-", "_")
        if not sep:
            raise ValueError(f"argument {pair!r} is not KEY=VALUE (e.g. input=clips/)")
        head, dot, sub = key.partition(".")
        if dot and head in ("tokenizer", "text_encoder"):
            kw[f"{head}_kwargs"][sub] = _value(val)
        elif key in fields:
            strings = ("input", "output", "tokenizer", "text_encoder", "image_condition", "clip_pooled", "audio_vae",
                       "missing_audio", "reference_dir", "missing_reference")
            kw[key] = val if key in strings else _value(val)
        else:
            raise ValueError(f"unknown argument {key!r}; choose from {', '.join(sorted(fields))}")
    for need in ("input", "output"):
        if need not in kw:
            raise ValueError(f"missing {need}=...; e.g. vfm prepare input=clips/ output=data/prepared")
    return PrepareConfig(**kw)


def run(args) -> int:
    import sys

    from nemo_vfm.data.prepare import prepare
    from nemo_vfm.io.run_lock import RunLockedError

    try:
        cfg = parse(list(args.overrides) + list(args.extra))
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"vfm prepare: error: {e}", file=sys.stderr)
        return 2
    try:
        res = prepare(cfg)
    except (RunLockedError, ValueError) as e:  # another vfm prepare writes this output, or it was prepared otherwise
        print(f"vfm prepare: error: {e}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as e:  # a full disk, a failed write, energon indexing: finished shards are kept
        print(f"vfm prepare: stopped: {e}", file=sys.stderr)
        return 1
    if res.rank == 0:
        print(f"rank 0/{res.world_size}: wrote {res.written} samples in {len(res.shards)} shards, skipped "
              f"{res.skipped_done} already prepared, {len(res.errors)} failed"
              + (f", {res.skipped_failed} failed before and unchanged" if res.skipped_failed else "")
              + f" -> {res.output}" + (" (indexed for Energon)" if res.indexed else ""))
        for err in res.errors[:10]:
            print(f"  skipped {err['source']}: {err['reason']}")
        if len(res.errors) > 10:
            print(f"  ... {len(res.errors) - 10} more in {res.output}/.prepare/report.json")
        for source, key in res.renamed[:10]:
            print(f"  {source}: its key collides with another input's, stored as {key!r}")
    return 0
