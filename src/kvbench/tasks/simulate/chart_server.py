"""Preloaded by the chart workers' fork server (the first of its modules): when the server ends
(the main process is gone), it ends at once instead of tearing down the modules it preloaded,
matplotlib and pandas among them. Until it has, it holds the command's output (it inherited
stdout and stderr), so whatever reads that output to its end would wait about a fifth of a second
more for nothing: every worker it forked has ended before it, and it owns no files. Imported
anywhere else (outside the server's preloading), it does nothing."""

import atexit
import os
import traceback
from multiprocessing import forkserver

if any(frame.f_code is forkserver.main.__code__ for frame, _ in traceback.walk_stack(None)):
    atexit.register(os._exit, 0)
