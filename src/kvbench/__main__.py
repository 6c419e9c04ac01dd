from kvbench.cli import run

run()
