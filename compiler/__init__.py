"""compiler: load and validate models, import to Relax, partition, build, run, verify.

Importing it sizes TVM's CPU thread pool of this process (and of the processes it starts) to the
CPUs it may use (:mod:`compiler.threads`): TVM's own default is half of them on x86.
"""

from compiler.threads import use_usable_cores

use_usable_cores()
