"""What the tests share: builders of payloads and rows, handles on the service run as a
child process and on the lakes it writes, and the modules tests start as processes.

Test modules import from here and take fixtures from the conftest files, never from each
other.
"""
