"""python -m experiments.otc_efficiency [--seeds=0,1,2] [--smoke] (see run.py)."""

from absl import app

from experiments.otc_efficiency import run

if __name__ == "__main__":
  app.run(run.main)
