"""``epochal train``: the main job.

    epochal train                                   # the tiny preset: a CPU demo, no downloads
    epochal train --config my.toml                  # a real configuration
    epochal train --preset gpt2-small --data.data_path='["/data/owt_text_document"]'
    epochal train --config runs/tiny/config.toml --run_dir=runs/tiny --training.train_iters=600 --scheduler.lr_decay_iters=300
                                                    # train the finished tiny run further, its
                                                    # learning-rate schedule kept
    epochal train --print-config                    # show the resolved configuration (TOML)
    epochal train --list-options training           # every option of a section, with its meaning

With no ``--config`` the ``tiny`` preset is used: it tokenizes a deterministic
subset of Python's standard-library sources with a BPE tokenizer trained on them
(both cached), trains a small Llama-style model for 300 steps, evaluates,
checkpoints, plots the loss, and prints where everything is and what to try next.
Running it again resumes from the run's latest checkpoint (``checkpoint.resume="auto"``).

Overrides are ``--section.key=value`` (TOML literals); see
:mod:`epochal.train.config`. The run directory is named after the run unless
``run_dir`` is set (:mod:`epochal.train.config.run_name`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

__all__ = ["add_arguments", "run"]


def _epilog() -> str:
    """The presets (from their definitions), how to list options, and where runs go."""
    from epochal.train.config.presets import PRESET_SUMMARIES

    width = max(len(name) for name in PRESET_SUMMARIES)
    presets = "\n".join(f"  {n:<{width}}  {s}" for n, s in PRESET_SUMMARIES.items())
    return (
        f"presets (--preset NAME; tiny without --config):\n{presets}\n\n"
        "options: --section.key=value with a TOML value, e.g. --training.train_iters=100 or\n"
        "  --data.data_path='[\"my_text_document\"]'. epochal train --list-options [SECTION]\n"
        "  lists every option with its type, default and meaning (sections: model, data,\n"
        "  training, optimizer, scheduler, checkpoint, logging, parallel, finetune).\n\n"
        "run directory: unless --run_dir (or run_dir in the file) is given, a run trains in\n"
        "  runs/<preset>, or runs/<config file name> with --config; options that change what\n"
        "  is trained (model, data, seed, batch sizes, optimizer, schedule, precision, parallel\n"
        "  layout) add a hash of their values: runs/tiny-1af64f53. Options that do not\n"
        "  (training.train_iters, evaluation, checkpoint, logging, device, speed levers,\n"
        "  training.memory_check, training.deterministic_kernels) keep\n"
        "  the name, so the same command resumes its run and a larger\n"
        "  --training.train_iters continues it. A run directory holding another run is\n"
        "  refused before anything starts."
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``--config``, ``--preset``, ``--print-config``, ``--list-options`` and the overrides."""
    from epochal.train.config.presets import PRESETS

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _epilog()
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file")
    parser.add_argument(
        "--preset",
        metavar="NAME",
        help=f"base preset: {', '.join(PRESETS)} (tiny without --config; see below)",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved configuration and exit"
    )
    parser.add_argument(
        "--list-options",
        nargs="?",
        const="",
        metavar="SECTION",
        help="list every option (of SECTION) with type, default and meaning, and exit; with "
        "--preset/--config, their values",
    )
    parser.add_argument(
        "--oversubscribe",
        action="store_true",
        help="launch more CPU processes than 4 per CPU core (the bound epochal launch shares)",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="--section.key=value",
        help="configuration overrides, e.g. --training.train_iters=100 --run_dir=runs/x",
    )
    parser.usage = (
        "epochal train [--config FILE] [--preset NAME] [--print-config] "
        "[--list-options [SECTION]] [--oversubscribe] [--section.key=value ...]"
    )
    parser.allow_abbrev = False
    # argparse rejects unknown "--x.y=z" options; accept them as overrides instead
    # (the dispatcher in epochal.cli calls parser.parse_args).
    parse_known = parser.parse_known_args

    def parse_args(args=None, namespace=None):  # noqa: ANN001, ANN202 - argparse's signature
        ns, unknown = parse_known(args, namespace)
        bad = [u for u in unknown if not (u.startswith("--") and "=" in u)]
        if bad:
            parser.error(f"unrecognized arguments: {' '.join(bad)} ({_hint(parser, bad[0])})")
        ns._unknown = unknown
        ns._argv = list(sys.argv[1:] if args is None else args)
        return ns

    parser.parse_args = parse_args  # type: ignore[method-assign]


def _hint(parser: argparse.ArgumentParser, arg: str) -> str:
    """What to write instead of the unrecognized ``arg``: the closest flag or option (difflib)."""
    from epochal.train.config.options import close_options, describe_options

    name = arg.lstrip("-").replace("-", "_")
    if arg.startswith("--") and "." in name:  # --training.train_iters 5: the value needs "="
        return f"overrides need '=': --{name}=VALUE"
    flags = [f.lstrip("-") for a in parser._actions for f in a.option_strings if f.startswith("--")]
    options = [o.name for o in describe_options()]
    near = close_options(arg.lstrip("-"), flags) or close_options(name, [], everywhere=options)
    if near:
        shown = [f"--{n}" if n in flags else f"--{n}=VALUE" for n in near]
        return f"did you mean {' or '.join(shown)}?"
    return "overrides look like --section.key=value; epochal train --list-options lists them"


def _split_overrides(args: argparse.Namespace, unknown: list[str]) -> list[str]:
    items = list(getattr(args, "overrides", []) or []) + list(unknown)
    for item in items:
        if "=" not in item:
            raise ValueError(
                f"unrecognized argument {item!r}; overrides look like --section.key=value"
            )
    return items


def run(args: argparse.Namespace) -> int:
    """Resolve the configuration, check it, prepare data, train, plot; 0 on success, 2 on a configuration error."""
    from epochal.model.config import ConfigError
    from epochal.train.config import build_config, to_toml
    from epochal.train.config.toml_io import sets_run_dir
    from epochal.train.state.checkpoint import CheckpointError
    from epochal.train.state.encoder_init import finetune_overrides

    try:
        overrides = _split_overrides(args, getattr(args, "_unknown", []))
        if getattr(args, "list_options", None) is not None:
            return _list_options(args, overrides)
        # A fine-tuning head with checkpoint.init_from, or init_from a Hugging Face folder:
        # the model's shape comes from the checkpoint.
        encoder = finetune_overrides(args.config, overrides)
        preset = args.preset or (None if args.config or encoder else "tiny")
        config = build_config(
            preset=preset,
            config_file=args.config,
            overrides=overrides,
            init_model=encoder,
            require_data=not args.print_config,
            log=_note,
        )
        pinned = sets_run_dir(args.config, overrides)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"epochal train: error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(to_toml(config, pin_run_dir=pinned), end="")
        _print_notes(config, args)
        return 0
    from epochal.parallel.launch import needs_relaunch, relaunch, under_launcher
    from epochal.train.config.preflight import preflight

    relaunching = needs_relaunch(config.parallel)
    try:  # what can be checked before any process starts or any data is prepared
        preflight(
            config, relaunching=relaunching, oversubscribe=getattr(args, "oversubscribe", False)
        )
    except ConfigError as exc:
        if not under_launcher() or os.environ.get("RANK") == "0":  # once, not once per rank
            print(f"epochal train: error: {exc}", file=sys.stderr)
        return 2
    from epochal.train.state.run_lock import RunDirLocked, check_run_dir_free

    try:  # another job training in this run directory: say so before preparing anything
        if not under_launcher() or os.environ.get("RANK") == "0":
            check_run_dir_free(config.run_dir)
    except RunDirLocked as exc:
        print(f"epochal train: error: {exc}", file=sys.stderr)
        return 1
    if relaunching:  # several processes asked for, no torchrun: start it
        return relaunch(config.parallel, ["train", *getattr(args, "_argv", [])])
    try:
        rc = _train(config)
        if rc == 0:
            from epochal.parallel.launch import report_clean_exit

            report_clean_exit()
        return rc
    except ConfigError as exc:
        print(f"epochal train: error: {exc}", file=sys.stderr)
        return 2
    except (CheckpointError, OSError, ValueError) as exc:
        print(f"epochal train: error: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:
        from epochal.parallel.watchdog import describe_collective_timeout

        message = describe_collective_timeout(exc, timeout_minutes=config.parallel.timeout_minutes)
        if message is None:
            raise
        print(f"epochal train: error: {message}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)  # a timed-out process group can abort in its destructor: leave now


def _print_notes(config, args: argparse.Namespace) -> None:  # noqa: ANN001 - a TrainConfig
    """``--print-config``'s notes on standard error: what training would need
    (:func:`~epochal.train.config.preflight.training_notes`); once under a launcher."""
    from epochal.train.config.preflight import training_notes

    oversubscribe = getattr(args, "oversubscribe", False)
    for note in training_notes(config, oversubscribe=oversubscribe):
        _note(note)


def _note(line: str) -> None:
    """Print a note once per job: not on every rank, nor again in a job this command relaunched."""
    from epochal.parallel.launch import under_launcher

    if os.environ.get("EPOCHAL_RELAUNCHED"):  # the command that launched it said it already
        return
    if not under_launcher() or os.environ.get("RANK") == "0":
        print(f"epochal train: note: {line}", file=sys.stderr, flush=True)


def _list_options(args: argparse.Namespace, overrides: list[str]) -> int:
    """Print every option (of ``--list-options SECTION``) with its type, value and meaning."""
    from epochal.train.config import build_config
    from epochal.train.config.options import describe_options, plain
    from epochal.train.config.toml_io import _toml_value

    config = None
    source = "built-in defaults; add --preset NAME or --config FILE to see theirs"
    if args.preset or args.config or overrides:
        config = build_config(
            preset=args.preset, config_file=args.config, overrides=overrides, require_data=False
        )
        given = (
            f"preset {args.preset}" if args.preset else "",
            f"file {args.config}" if args.config else "",
            "overrides" if overrides else "",
        )
        source = ", ".join(x for x in given if x)
    options = describe_options(args.list_options or None, config)
    print(f"epochal train options (--section.key=value; values: {source})")
    current = None
    for o in options:
        if o.section != current:
            current = o.section
            print(f"\n[{o.section}]" if o.section else "\n(top level)")
        value = "unset" if o.default is None else _toml_value(o.default)
        peers = "; ".join(
            f"{who} {flag}"
            for who, flag in (("Megatron", o.megatron), ("BioNeMo", o.bionemo))
            if flag
        )
        print(f"  {o.name} = {value}  ({o.type})")
        print(f"      {plain(o.summary)}" + (f" [{peers}]" if peers else ""))
    return 0


def _train(config) -> int:
    from epochal._text import plural
    from epochal.parallel.launch import is_logging_rank
    from epochal.train.inputs.loaders import build_data
    from epochal.train.observe.plot import plot_run
    from epochal.train.parallel_trainer import ParallelTrainer, wants_parallel
    from epochal.train.result import skipped_line
    from epochal.train.trainer import Trainer

    t0 = time.perf_counter()
    if wants_parallel(config):  # under torchrun or a parallel layout: only rank 0 prints
        trainer = ParallelTrainer(config)
        if not is_logging_rank():
            trainer.train()
            return 0
        say = lambda msg: print(msg, flush=True)  # noqa: E731
        say(
            f"epochal train: run directory {config.run_dir}; layout {trainer.dims} on "
            f"{plural(trainer.dist.world_size, 'process')}"
        )
        say(f"data: {trainer.data.description}")
        n_params = trainer.num_parameters()
    else:
        say = lambda msg: print(msg, flush=True)  # noqa: E731
        say(f"epochal train: run directory {config.run_dir}")
        data = build_data(config, log=say)
        say(f"data: {data.description}")
        trainer = Trainer(config, data=data)
        n_params = trainer.model_parts[0].num_parameters()
    mc = trainer.model_config
    t = config.training
    say(
        f"model: {n_params / 1e6:.2f}M parameters ({plural(mc.num_layers, 'layer')}, hidden "
        f"{mc.hidden_size}, {plural(mc.num_attention_heads, 'head')}, vocab {mc.vocab_size} "
        f"padded to {mc.padded_vocab_size}); {plural(t.train_iters, 'step')} of "
        f"{t.global_batch_size} x {plural(config.data.seq_length, 'token')} on {trainer.device}"
    )
    if mc.lora_rank > 0 or mc.freeze_encoder:
        say(_trainable_line(mc))
    result = trainer.train()
    plot = None
    try:
        plot = plot_run(config.run_dir)
    except (FileNotFoundError, ValueError):
        pass
    ckpt = result.last_checkpoint
    where = (
        f"run: {result.run_dir}; checkpoints: {ckpt if ckpt else 'none'}; plot: {plot or 'none'}"
    )
    if not result.losses:
        from epochal.train.next_steps import train_further_command

        further = train_further_command(config, result.run_dir, final_step=result.final_step)
        say(
            f"nothing to do: {result.run_dir} is already at step {result.final_step} "
            f"(training.train_iters={t.train_iters}). To train further, its learning-rate "
            f"schedule kept: {further}; to start another run, add --run_dir=NEW_DIR to this "
            "command"
        )
        say(where)
        return 0
    ev = ""
    if result.eval_loss is not None:
        ev = f", validation loss {result.eval_loss:.3f}"
        if result.eval_ppl is not None:  # a token cross-entropy's (not a fine-tuning head's)
            ev += f" (perplexity {result.eval_ppl:.1f})"
    resumed = f" (resumed from step {result.start_step})" if result.start_step else ""
    say(
        f"trained steps {result.start_step + 1}-{result.final_step}{resumed} in {time.perf_counter() - t0:.0f} s "
        f"({result.tokens_per_s:,.0f} tokens/s): loss {result.losses[0]:.3f} -> {result.last_loss:.3f}{ev}"
    )
    if result.skipped_steps:
        say(skipped_line(result.skipped_steps, len(result.losses)))
    if result.hardware:
        say(f"on {result.hardware}: {result.utilization}")
    epochs = _epoch_line(config.run_dir)
    if epochs:
        say(epochs)
    if result.sample_check:  # a resumed run: does its data name the checkpoint's samples?
        say(result.sample_check)
    if result.stopped_by:
        say(
            f"stopped early ({result.stopped_by}) after step {result.final_step} of "
            f"{t.train_iters}; checkpoint saved to {ckpt}; "
            "run the same command again to resume"
        )
    say(where)
    if ckpt:
        _say_next(config, result, say)
    return 0


def _trainable_line(model_config) -> str:  # noqa: ANN001 - a ModelConfig
    """PEFT's ``print_trainable_parameters`` line for the model (built on the meta device)."""
    import torch

    from epochal.model import build_model
    from epochal.model.lora import parameter_counts

    with torch.device("meta"):
        trainable, total = parameter_counts(build_model(model_config))
    return (
        f"trainable params: {trainable:,d} || all params: {total:,d} || "
        f"trainable%: {100 * trainable / total:.4f}"
    )


def _say_next(config, result, say) -> None:  # noqa: ANN001 - TrainConfig, TrainResult, print
    """The commands to try next (:func:`epochal.train.next_steps.next_commands`)."""
    from epochal.train.next_steps import next_commands

    say("next:")
    for line in next_commands(config, result.run_dir, final_step=result.final_step):
        say(f"  {line}")


def _epoch_line(run_dir) -> str | None:
    """The run's epoch summary (:func:`epochal.train.inputs.epoch_evidence.epoch_summary`) from its metrics, if any."""
    from epochal.train.inputs.epoch_evidence import epoch_summary
    from epochal.train.observe.metrics import read_metrics

    try:
        return epoch_summary(read_metrics(os.path.join(run_dir, "metrics.jsonl")))
    except FileNotFoundError:
        return None
