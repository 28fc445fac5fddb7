import sys

from prefzoo.cli.main import main

sys.exit(main())
