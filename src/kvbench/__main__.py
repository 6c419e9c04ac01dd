from kvbench.cli import main

main()
