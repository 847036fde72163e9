# A torch 2.6 worker that fails through torchelastic's @record, which writes
# the error file gorun must show in its failure report.
import os

import torch
from torch.distributed.elastic.multiprocessing.errors import record


def give_up():
    raise ValueError(f"rank one gives up on torch {torch.__version__}")


@record
def main():
    if os.environ["RANK"] == "1":
        give_up()


main()
