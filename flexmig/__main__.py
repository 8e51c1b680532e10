"""`python -m flexmig ...` runs the same CLI as the `flexmig` console script."""

import sys

from flexmig.cli import main

sys.exit(main())
