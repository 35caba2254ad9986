"""`python -m radixgen.runtime.server [flags]` is `radixgen serve [flags]`."""

import sys

from radixgen.runtime.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
