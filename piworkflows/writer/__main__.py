import sys

from piworkflows.writer.process import main

sys.exit(main())
