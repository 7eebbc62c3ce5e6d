import sys

from xumd.startup.main import main

sys.exit(main())
