"""``vfm generate``: sample videos from a checkpoint with classifier-free guidance; writes mp4 and gif.

    vfm generate --ckpt experiments/quickstart --prompt "a red circle moving left on a black background"
    vfm generate --ckpt run/checkpoints/step=00001000.ckpt --prompts prompts.txt --guidance 5 --steps 50
    # 4 GPUs: the video tokens split over 4 context-parallel ranks (or 2 CFG groups x CP2)
    torchrun --nproc-per-node 4 -m nemo_vfm.cli.main generate --ckpt run/checkpoints --prompts p.txt --cp 4
    torchrun --nproc-per-node 4 -m nemo_vfm.cli.main generate --ckpt dit.safetensors --prompt "..." --cfg-parallel
    vfm generate --ckpt run/checkpoints/step=00001000.ckpt --export-safetensors dit.safetensors
    # a published Wan 2.1 diffusers pipeline folder; I2V folders take --image
    vfm generate --ckpt /models/Wan2.1-T2V-1.3B-Diffusers --prompt "a fox in the snow" --steps 50 --guidance 5
    vfm generate --ckpt /models/Wan2.1-I2V-14B-480P-Diffusers --image first.png --prompt "..."
    # Wan 2.2: TI2V-5B with or without --image; A14B folders switch experts (--guidance-2: the low-noise expert's)
    vfm generate --ckpt /models/Wan2.2-TI2V-5B-Diffusers --prompt "..." [--image first.png]
    vfm generate --ckpt /models/Wan2.2-T2V-A14B-Diffusers --prompt "..." --guidance 4 --guidance-2 3
    # Cosmos-Predict2.5 folders: Text2World, Video2World (the clip's last frames) or Image2World
    vfm generate --ckpt /models/Cosmos-Predict2.5-2B --prompt "..." --video clip.mp4 [--cond-frames 1] --guidance 8
    # HunyuanVideo 1.5 pipeline folders: T2V, or I2V folders with --image (the release's guidance is 6)
    vfm generate --ckpt /models/HunyuanVideo-1.5-480p_t2v --prompt 'a shop sign that says "OPEN"' --guidance 6
    # Kandinsky 6 pipeline folders: video with sound when the folder has audio_vae/ and vocoder/ (--no-audio: video only)
    vfm generate --ckpt /models/Kandinsky-6-Lite --prompt "rain on a tin roof" [--image first.png] [--no-audio]
    # LTX-2 pipeline folders: video with sound (an mp4 with an audio track and a wav per prompt), optionally from an image
    vfm generate --ckpt /models/LTX-2 --prompt "a drummer on a rooftop at dusk" [--image first.png]
    # an LTX-2 or Kandinsky 6 training run: its transformer, the other parts from its model.pretrained pipeline folder
    vfm generate --ckpt experiments/lora_ltx2 --prompt "a drummer on a rooftop at dusk"
    # sparse self-attention (DiT, Wan): sliding tile attention over 3D tiles of the latent grid
    vfm generate --ckpt /models/Wan2.1-T2V-1.3B-Diffusers --prompt "..." --attention sta --attention-window 3x3x3
"""

import argparse
import dataclasses
import os
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", required=True, help="a step=N.ckpt file or sharded folder, a .safetensors export, or "
                                                 "an experiment folder (newest checkpoint)")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts", help="a text file with one prompt per line")
    p.add_argument("--out", default="generated", help="output folder")
    p.add_argument("--steps", type=int, default=None, help="sampler steps (default 35; LTX-2 folders and runs: 30; "
                                                            "Kandinsky 6: 50; a distilled student: its own)")
    p.add_argument("--guidance", type=float, default=None, help="classifier-free guidance scale (1 = off; default 5; "
                                                                "LTX-2 folders: the video's, default 3, the audio's "
                                                                "stays 7; a distilled student: 1)")
    p.add_argument("--guidance-2", type=float, default=None, help="Wan 2.2 A14B: the low-noise expert's guidance "
                                                                   "scale (default: --guidance)")
    p.add_argument("--sampler", default=None, choices=("heun", "euler", "res", "flow-euler", "unipc"),
                   help="default: the checkpoint's (Wan folders: unipc, diffusers' Wan scheduler), else heun for "
                        "EDM and flow-euler for flow matching")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8, help="prompts per batch")
    p.add_argument("--frames", type=int, help="video frames (default: the training size)")
    p.add_argument("--height", type=int, help="video height in pixels (default: the training size)")
    p.add_argument("--width", type=int, help="video width in pixels (default: the training size)")
    p.add_argument("--no-ema", action="store_true", help="use the raw weights instead of the EMA weights")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available; torchrun: cuda:LOCAL_RANK)")
    p.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"), help="default: bf16 on GPU, fp32 on CPU")
    p.add_argument("--text-encoder-device", default=None,
                   help="where rank 0 runs the text encoder (UMT5, Qwen2.5-VL): default the generation device, in "
                        "bf16 on a GPU; cpu keeps it off a card without room for it (float32, slow: torchrun runs "
                        "one CPU thread per process unless OMP_NUM_THREADS says otherwise)")
    p.add_argument("--cp", type=int, default=None, help="context parallel ranks (default: all ranks left after "
                                                        "--tp and --cfg-parallel)")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel ranks (with sequence parallel)")
    p.add_argument("--cfg-parallel", action="store_true", help="conditional and unconditional passes on two rank groups")
    p.add_argument("--cp-kind", default="auto", choices=("auto", "ring", "a2a"), help="auto: a2a when heads allow")
    p.add_argument("--decode-tile", type=int, default=0, help="decode in tiles of this many pixels, dealt to all "
                                                              "ranks (0: the tokenizer as configured)")
    p.add_argument("--decode-overlap", type=int, default=64, help="tile overlap in pixels (with --decode-tile)")
    p.add_argument("--gif", action=argparse.BooleanOptionalAction, default=True,
                   help="write a gif beside each mp4 (--no-gif: the mp4 alone; a 720p x 81-frame gif is ~30 MB)")
    p.add_argument("--upscale", type=int, default=0, help="nearest-neighbour upscaling of the output (0: auto)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile each transformer block (faster denoising after a one-time compile; default: "
                        "on for Wan checkpoints on CUDA, off otherwise)")
    p.add_argument("--flow-shift", type=float, default=None, help="flow-matching time shift of the sampler (default: "
                                                                   "the checkpoint's; Wan: 5.0, Wan I2V 480p: 3.0)")
    p.add_argument("--image", help="image-to-video (Wan and HunyuanVideo I2V folders; optional for Wan 2.2 TI2V, "
                                   "Cosmos, LTX-2 and Kandinsky 6 folders): the first frame")
    p.add_argument("--no-audio", action="store_true",
                   help="Kandinsky 6 folders with audio_vae/ and vocoder/ (and runs fine-tuned from them): video "
                        "only (the pipeline's sample_audio=False); without it they sample video and sound together")
    p.add_argument("--video", help="Cosmos Video2World: a clip whose last frames start the video (resized to the "
                                   "generation size)")
    p.add_argument("--cond-frames", type=int, default=None, help="Cosmos Video2World: clean latent frames taken "
                                                                 "from --video, 1 or 2 (default 2: the clip's last "
                                                                 "5 frames; 1: its last frame)")
    p.add_argument("--export-safetensors", metavar="FILE", help="write the checkpoint as one .safetensors file "
                                                                "(weights + config) and exit")
    p.add_argument("--attention", default=None, choices=("dense", "sta", "vsa"),
                   help="self-attention of a DiT or Wan network (default: the checkpoint's): dense, or sta (sliding "
                        "tile attention, docs/models.md 'Sparse attention'); vsa only for a checkpoint trained with it")
    p.add_argument("--attention-window", metavar="TxHxW", default=None,
                   help="STA: key tiles per axis around each query tile, odd (default: the checkpoint's, else 3x3x3)")
    p.add_argument("--attention-tile", metavar="TxHxW", default=None,
                   help="sparse attention: latent tokens per tile (default: the checkpoint's, else 4x8x4 = 128 tokens, "
                        "the block FlexAttention needs on CUDA)")
    p.add_argument("--trust-pickle", action="store_true", help="unpickle a .ckpt that needs more than our config "
                                                               "classes (weights_only=False: runs any code the file "
                                                               "holds; only for files you trust)")


def _prompts(args) -> list[str]:
    prompts = list(args.prompt)
    if args.prompts:
        path = Path(args.prompts)
        if not path.is_file():
            raise FileNotFoundError(f"prompt file not found: {path}")
        prompts += [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not prompts:
        raise ValueError("give at least one --prompt or a --prompts file")
    return prompts


def check_args(args) -> None:
    """Refuse bad arguments before anything is loaded (one sentence each)."""
    import math

    for name in ("steps", "batch_size", "frames", "height", "width", "cp", "tp"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    for name in ("upscale", "decode_tile", "decode_overlap"):
        value = getattr(args, name, 0)
        if value is not None and value < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {value}")
    for name in ("guidance", "guidance_2"):
        value = getattr(args, name, None)
        if value is not None and not math.isfinite(value):
            raise ValueError(f"--{name.replace('_', '-')} must be a finite number (1 = off), got {value}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is an existing file; give a folder to write the videos into")


def sampling_config(args, generation, objective, source, default_steps: int = 35, default_guidance: float = 5.0):
    """The ``SamplingConfig`` of a ``vfm generate`` / ``vfm evaluate`` call: the flags, else the checkpoint's
    defaults (``args.steps`` and ``args.guidance`` are filled in). A distilled student (``generation["student"]``)
    samples its own levels without CFG, and says so; flags that contradict that raise."""
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.sampling import check_sampler, default_sampler

    student = generation.get("student")
    if student is None:
        args.steps = default_steps if args.steps is None else args.steps
        args.guidance = default_guidance if args.guidance is None else args.guidance
        sampler = args.sampler or generation.get("sampler") or default_sampler(objective)
        check_sampler(objective, sampler)
        return SamplingConfig(num_steps=args.steps, guidance=args.guidance, sampler=sampler, seed=args.seed)
    levels = tuple(float(v) for v in student["levels"])
    shown = [round(v, 4) for v in levels]
    if args.steps not in (None, len(levels)):
        raise ValueError(f"{source} is a {len(levels)}-step distilled student trained on noise levels {shown}: it "
                         f"samples {len(levels)} steps; drop --steps or pass --steps {len(levels)}")
    if args.guidance not in (None, 1.0):
        raise ValueError(f"{source} is a distilled student: the teacher's guidance is folded into it, so it samples "
                         "without classifier-free guidance; drop --guidance")
    if args.sampler is not None:
        raise ValueError(f"{source} is a distilled student: it samples with its own few-step schedule; drop --sampler")
    args.steps, args.guidance = len(levels), 1.0
    if os.environ.get("RANK", "0") == "0":  # once under torchrun
        print(f"{source} is a {len(levels)}-step distilled student ({student.get('method', 'dmd2')}): sampling its noise "
              f"levels {shown}, no CFG")
    return SamplingConfig(num_steps=len(levels), guidance=1.0, sampler="few-step", seed=args.seed, levels=levels)


def _thw(flag: str, text: str) -> tuple[int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"{flag} takes three positive integers as TxHxW (e.g. 3x3x3), got {text!r}")
    return tuple(int(p) for p in parts)


def apply_attention_args(args, info) -> None:
    """Set ``--attention``, ``--attention-window`` and ``--attention-tile`` on the checkpoint's model config
    (validated by the config). VSA cannot be switched on or off here: its learned gates come from training."""
    kind, window, tile = (getattr(args, n, None) for n in ("attention", "attention_window", "attention_tile"))
    if kind is None and window is None and tile is None:
        return
    cfg = info.model_config
    if not hasattr(cfg, "attention"):
        raise ValueError(f"--attention applies to DiT and Wan checkpoints; this {type(cfg).__name__} network has dense "
                         "attention only: drop --attention, --attention-window and --attention-tile")
    kind = kind or cfg.attention
    if (kind == "vsa") != (cfg.attention == "vsa"):
        raise ValueError(f"--attention {kind} on a checkpoint trained with attention={cfg.attention!r}: VSA's learned "
                         "gates exist only in a VSA-trained network; use --attention sta or dense (or train with "
                         "model.attention=vsa)")
    if window is not None and kind != "sta":
        raise ValueError("--attention-window is the window of --attention sta; add --attention sta or drop it")
    if tile is not None and kind == "dense":
        raise ValueError("--attention-tile applies to sparse attention (--attention sta); add it or drop the tile")
    changes = {"attention": kind}
    if window is not None:
        changes["attention_window"] = _thw("--attention-window", window)
    if tile is not None:
        changes["attention_tile"] = _thw("--attention-tile", tile)
    info.model_config = dataclasses.replace(cfg, **changes)


def default_compile(args, info, device) -> bool:
    """``--compile`` as given, else on CUDA for the published folders whose family's generation adapter says so
    (``compile_on_cuda``: Wan; docs/models_wan.md); other checkpoints stay eager, where compiling would take longer
    than sampling."""
    from nemo_vfm.inference.families import generation_of

    if args.compile is not None:
        return args.compile
    return device.type == "cuda" and generation_of(info).compile_on_cuda


def _pixel_size(args, tokenizer, latent_thw):
    """Requested (frames, height, width), the training size where not given."""
    frames, height, width = tokenizer.pixel_shape(*latent_thw)
    return args.frames or frames, args.height or height, args.width or width


def run(args) -> int:
    try:
        return _run(args)
    except (ValueError, FileNotFoundError, NotImplementedError) as e:
        if os.environ.get("RANK", "0") == "0":  # every rank fails the same way; say it once
            print(f"vfm generate: error: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    import torch
    import torch.distributed as dist
    from tqdm.auto import tqdm

    from nemo_vfm.inference.checkpoint import export_safetensors, read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.distributed import InferenceLayout, check_model_layout, init_distributed
    from nemo_vfm.inference.families import generation_of, published_kinds
    from nemo_vfm.inference.generate import write_videos
    from nemo_vfm.inference.generation import SampleContext
    from nemo_vfm.inference.sampling import check_objective
    from nemo_vfm.inference.sizes import check_memory, latent_size

    trust = getattr(args, "trust_pickle", False)
    if args.export_safetensors:
        from nemo_vfm.inference.export import check_exportable

        check_exportable(args.ckpt)
        out = export_safetensors(args.ckpt, args.export_safetensors, use_ema=not args.no_ema, allow_pickle=trust)
        print(f"wrote {out}")
        return 0
    check_args(args)
    prompts = _prompts(args)
    info = read_checkpoint_info(args.ckpt, allow_pickle=trust)
    family = generation_of(info)  # the family's generation adapter: conditioning inputs, sampler
    if family.unavailable is not None:
        raise NotImplementedError(family.unavailable)
    if family.run_info is not None and info.kind not in published_kinds():
        info = family.run_info(info)  # a training run: the other parts from its model.pretrained pipeline folder
    check_objective(info.objective, info.path)
    apply_attention_args(args, info)
    gen = info.generation
    if family.check is not None and info.kind == family.kind:
        family.check(info)
    takes_image = family.image(info)
    video, cond_frames = getattr(args, "video", None), getattr(args, "cond_frames", None)
    if (takes_image == "required" and not args.image) or (args.image and takes_image == "none"):
        raise ValueError("this is an image-to-video model: pass --image FIRST_FRAME" if takes_image == "required" else
                         "--image is for image-to-video models (Wan and HunyuanVideo I2V folders, Wan 2.2 TI2V, "
                         "Cosmos, LTX-2); drop it")
    if video and not family.video:
        raise ValueError("--video is Cosmos-Predict2.5 Video2World (a Cosmos pipeline folder as --ckpt); drop it")
    if video and args.image:
        raise ValueError("give --video CLIP (Video2World) or --image FIRST_FRAME (Image2World), not both")
    if cond_frames is not None and not video:
        raise ValueError("--cond-frames counts the clean frames taken from --video; add --video CLIP or drop it")
    if video and not Path(video).is_file():
        raise FileNotFoundError(f"video file not found: {video}")
    if args.image and family.video and not Path(args.image).is_file():
        raise FileNotFoundError(f"image not found: {args.image}")
    if getattr(args, "guidance_2", None) is not None and "experts" not in gen:
        raise ValueError("--guidance-2 is the low-noise expert's guidance of a Wan 2.2 A14B folder; drop it")
    if not gen:
        raise ValueError(f"{args.ckpt} does not record its tokenizer and text encoder (trained on mock latents?); "
                         "nothing to decode with")
    if args.flow_shift is not None:
        if not hasattr(info.objective, "shift"):
            raise ValueError("--flow-shift applies to flow-matching checkpoints; drop it")
        info.objective = dataclasses.replace(info.objective, shift=args.flow_shift)
    cfg = sampling_config(args, gen, info.objective, info.path, **family.sampling_defaults)
    sampler = cfg.sampler
    started = dist.is_initialized()
    world_env = int(os.environ.get("WORLD_SIZE", "1"))
    layout = InferenceLayout.for_world(world_env, cp=args.cp, tp=args.tp, cfg_parallel=args.cfg_parallel,
                                       cp_kind=args.cp_kind)
    if layout.cfg_parallel and args.guidance == 1.0:
        raise ValueError("--cfg-parallel needs classifier-free guidance; set --guidance above 1 or drop --cfg-parallel")
    if family.check_run is not None and (info.kind == family.kind or info.pipeline is not None):
        family.check_run(info, args, layout)  # flags and layout the family refuses, before the weights load
    elif getattr(args, "no_audio", False) and os.environ.get("RANK", "0") == "0":
        print("vfm generate: warning: --no-audio has no effect: this checkpoint generates video only")
    rank, world, device = init_distributed(args.device)
    try:
        from nemo_vfm.data.encoders import build_tokenizer

        tokenizer = build_tokenizer(gen["tokenizer"]["name"], **gen["tokenizer"]["kwargs"])
        if args.decode_tile:
            from nemo_vfm.tokenizers.tiling import TiledTokenizer

            tokenizer = TiledTokenizer(tokenizer, tile_size=args.decode_tile, tile_overlap=args.decode_overlap)
        channels, *trained_thw = gen["latent_shape"]
        frames, height, width = _pixel_size(args, tokenizer, trained_thw)
        if family.image_size is not None and args.image and not (args.height or args.width):
            height, width = family.image_size(info, args.image)  # as the family's I2V pipeline: the image's size
        thw = latent_size(tokenizer, frames, height, width, info.model_config.patch_size, layout.token_split)
        check_model_layout(info.model_config, layout, thw)  # heads vs tp/cp, before loading weights
        dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
        check_memory((frames, height, width), thw, info.model_config.patch_size,
                     getattr(info.model_config, "hidden_size", 0), min(args.batch_size, len(prompts)), device,
                     dtype_bytes=4 if dtype == "fp32" else 2, token_split=layout.token_split,
                     copies=2 if args.guidance != 1.0 and not layout.cfg_parallel else 1)
        compile = default_compile(args, info, device)
        engine = InferenceEngine.from_checkpoint(info, layout, device=device, dtype=dtype, use_ema=not args.no_ema,
                                                 latent_thw=thw, tokenizer=tokenizer.to(device).eval(),
                                                 compile=compile, text_encoder_device=args.text_encoder_device)
        out = Path(args.out)
        fps = gen.get("fps") or 8.0
        if rank == 0:
            attention = getattr(info.model_config, "attention", "dense")
            print(f"generating {len(prompts)} video(s) of {frames}x{height}x{width} px ({channels}x{'x'.join(map(str, thw))} "
                  f"latents) on {world} process(es): {layout.describe()}, {sampler} x {args.steps} steps, {dtype}"
                  + ("" if attention == "dense" else f", {attention} attention"))
        sample = family.sampler(SampleContext(args, info, engine, layout, rank, device, frames, height, width,
                                              channels, thw, cfg, compile))  # once: extra encoders, conditions
        written, totals = [], {}
        for i in tqdm(range(0, len(prompts), args.batch_size), desc="generating", unit="batch", disable=rank != 0):
            batch = prompts[i: i + args.batch_size]
            videos, times, *audio = sample(batch)  # a sampler with sound returns (waveforms, sample rate) too
            for k, v in times.items():
                totals[k] = totals.get(k, 0.0) + v
            if rank == 0:
                if not bool(torch.isfinite(videos).all()):
                    raise ValueError(f"the sampled video holds NaN/Inf (checkpoint {info.path}, guidance "
                                     f"{args.guidance}); nothing was written; try another checkpoint or sampler")
                upscale = args.upscale or max(1, 256 // max(videos.shape[-2:]))
                written += write_videos(videos, out / f"batch{i // args.batch_size:03d}", fps=fps, upscale=upscale,
                                        captions=batch, gif=args.gif, audio=audio[0] if audio else None)
                tqdm.write("  " + ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.2f}s" for k, v in times.items()))
        if rank == 0:
            split = ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.2f}s" for k, v in totals.items())
            print(f"wrote {len([w for w in written if w.suffix == '.mp4'])} video file(s) to {out} "
                  f"(checkpoint step {engine.step}); time per stage: {split}")
    finally:
        if dist.is_initialized() and not started:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            dist.destroy_process_group()
    return 0
