# A worker that fails through torchelastic's @record, which writes the error
# file gorun must show in its failure report.
import os

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("rank one gives up")


main()
