from autograder.cli import main

if __name__ == "__main__":  # guarded: worker processes started with "spawn" import this module too
    raise SystemExit(main())
