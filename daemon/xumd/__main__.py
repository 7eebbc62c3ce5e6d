import sys

from xumd.main import main

sys.exit(main())
