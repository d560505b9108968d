"""``epochal train``: the main job.

    epochal train                                   # the tiny preset: a CPU demo, no downloads
    epochal train --config my.toml                  # a real configuration
    epochal train --preset gpt2-small --data.data_path='["/data/owt_text_document"]'
    epochal train --training.train_iters=600 --run_dir=runs/longer
    epochal train --print-config                    # show the resolved configuration (TOML)

With no ``--config`` the ``tiny`` preset is used: it tokenizes a deterministic
subset of Python's standard-library sources with a BPE tokenizer trained on them
(both cached), trains a small Llama-style model for 300 steps, evaluates,
checkpoints, plots the loss, and prints where everything is. Running it again
resumes from the run's latest checkpoint (``checkpoint.resume="auto"``).

Overrides are ``--section.key=value`` (TOML literals); see
:mod:`epochal.train.config`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``--config``, ``--preset``, ``--print-config`` and the ``--section.key=value`` overrides."""
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file")
    parser.add_argument(
        "--preset", metavar="NAME", help="base preset: tiny (default without --config), gpt2-small"
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved configuration and exit"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="--section.key=value",
        help="configuration overrides, e.g. --training.train_iters=100 --run_dir=runs/x",
    )
    parser.usage = (
        "epochal train [--config FILE] [--preset NAME] [--print-config] [--section.key=value ...]"
    )
    parser.allow_abbrev = False
    # argparse rejects unknown "--x.y=z" options; accept them as overrides instead
    # (the dispatcher in epochal.cli calls parser.parse_args).
    parse_known = parser.parse_known_args

    def parse_args(args=None, namespace=None):  # noqa: ANN001, ANN202 - argparse's signature
        ns, unknown = parse_known(args, namespace)
        bad = [u for u in unknown if not (u.startswith("--") and "=" in u)]
        if bad:
            parser.error(
                f"unrecognized arguments: {' '.join(bad)} (overrides look like --section.key=value)"
            )
        ns._unknown = unknown
        ns._argv = list(sys.argv[1:] if args is None else args)
        return ns

    parser.parse_args = parse_args  # type: ignore[method-assign]


def _split_overrides(args: argparse.Namespace, unknown: list[str]) -> list[str]:
    items = list(getattr(args, "overrides", []) or []) + list(unknown)
    for item in items:
        if "=" not in item:
            raise ValueError(
                f"unrecognized argument {item!r}; overrides look like --section.key=value"
            )
    return items


def run(args: argparse.Namespace) -> int:
    """Resolve the configuration, prepare data, train, plot; 0 on success, 2 on a configuration error."""
    from epochal.model.config import ConfigError
    from epochal.train.config import build_config, to_toml
    from epochal.train.state.checkpoint import CheckpointError
    from epochal.train.state.encoder_init import finetune_overrides

    try:
        overrides = _split_overrides(args, getattr(args, "_unknown", []))
        # A fine-tuning head with checkpoint.init_from: the encoder's shape comes from the checkpoint.
        encoder = finetune_overrides(args.config, overrides)
        preset = args.preset or (None if args.config or encoder else "tiny")
        config = build_config(
            preset=preset,
            config_file=args.config,
            overrides=[*(encoder or []), *overrides],
            require_data=not args.print_config,
        )
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"epochal train: error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(to_toml(config), end="")
        try:
            config.check_data()
        except ConfigError as exc:
            print(f"epochal train: note: to train, {exc}", file=sys.stderr)
        return 0
    from epochal.parallel.launch import needs_relaunch, relaunch, under_launcher

    relaunching = needs_relaunch(config.parallel)
    try:  # what can be checked before any process starts or any data is prepared
        _preflight(config, relaunching)
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


def _preflight(config, relaunching: bool) -> None:
    """Check the data files and the parallel layout; raise ConfigError naming the option."""
    from epochal.parallel.launch import under_launcher
    from epochal.train.config.limits import check_sizes
    from epochal.train.inputs.gpt import check_data_files
    from epochal.train.parallel_trainer import check_layout, wants_parallel
    from epochal.train.preflight import check_before_run

    check_sizes(config)
    if not (config.data.corpus or config.data.mock):
        check_data_files(config.data)
    check_before_run(config)
    if relaunching:
        from epochal.parallel.launch import check_launchable

        p = config.parallel
        check_layout(config, p.launch_world_size())  # what the options mean, then the machine
        check_launchable(
            p.launch_world_size(),
            config.training.device,
            option="parallel.nproc_per_node" if p.nproc_per_node else "parallel.data_parallel",
        )
    elif under_launcher() or wants_parallel(config):
        check_layout(config, int(os.environ.get("WORLD_SIZE", "1")))


def _train(config) -> int:
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
            f"epochal train: run directory {config.run_dir}; layout {trainer.dims} on {trainer.dist.world_size} processes"
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
    say(
        f"model: {n_params / 1e6:.2f}M parameters ({mc.num_layers} layers, hidden {mc.hidden_size}, "
        f"{mc.num_attention_heads} heads, vocab {mc.vocab_size} padded to {mc.padded_vocab_size}); "
        f"{config.training.train_iters} steps of {config.training.global_batch_size} x {config.data.seq_length} "
        f"tokens on {trainer.device}"
    )
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
        say(
            f"nothing to do: {result.run_dir} is already at step {result.final_step} "
            f"(training.train_iters={config.training.train_iters}); use another --run_dir to start over"
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
    if result.stopped_by:
        say(
            f"stopped early ({result.stopped_by}) after step {result.final_step} of "
            f"{config.training.train_iters}; checkpoint saved to {ckpt}; "
            "run the same command again to resume"
        )
    say(where)
    return 0


def _epoch_line(run_dir) -> str | None:
    """The run's epoch summary (:func:`epochal.train.inputs.epoch_evidence.epoch_summary`) from its metrics, if any."""
    from epochal.train.inputs.epoch_evidence import epoch_summary
    from epochal.train.observe.metrics import read_metrics

    try:
        return epoch_summary(read_metrics(os.path.join(run_dir, "metrics.jsonl")))
    except FileNotFoundError:
        return None
