"""What the run.py scripts that time loom against transformers.Trainer in interleaved rounds
share (benchmarks/hf_models, benchmarks/lora): the --rounds / --steps / --warmup options and a
run's step time."""
import sys

import numpy as np


def add_round_options(parser, rounds_help, steps):
    """--rounds (default 5), --steps (default `steps`) and --warmup (default 3) on `parser`."""
    parser.add_argument("--rounds", type=int, default=5, help=rounds_help)
    parser.add_argument("--steps", type=int, default=steps, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="steps per run left out before timing")


def parse_round_options(parser):
    """parser.parse_args(), with --rounds, --steps and --warmup checked to be at least 1."""
    opts = parser.parse_args()
    if opts.rounds < 1 or opts.steps < 1 or opts.warmup < 1:
        sys.exit("run.py: --rounds, --steps and --warmup must be at least 1")
    return opts


def median_step_s(step_end, warmup):
    """The median step time of a run, from each step's end time: step k takes
    end(k) - end(k - 1), and the first `warmup` steps are left out."""
    return float(np.median(np.diff(np.asarray(step_end))[warmup - 1:]))
