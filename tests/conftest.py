"""Suite-wide set-up: pin the process time zone, so timestamps collected from Spark are UTC."""

import os
import time

os.environ["TZ"] = "UTC"
time.tzset()
