try:
    from autograder.cli import main
except KeyboardInterrupt:  # Ctrl-C while the modules load: the same one line as during a command
    import sys

    print("\ninterrupted: run the same command again to resume", file=sys.stderr)
    raise SystemExit(130) from None

if __name__ == "__main__":  # guarded: worker processes started with "spawn" import this module too
    raise SystemExit(main())
