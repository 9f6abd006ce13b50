"""compiler: load and validate models, import to Relax, partition, build, run, verify.

One sub-package per role (as TVM's ``meta_schedule``): :mod:`compiler.frontends` (ONNX and
``.pt2`` to Relax), :mod:`compiler.limits`, :mod:`compiler.shapes` (buckets, padding),
:mod:`compiler.lowering`, :mod:`compiler.peers` (library kernels), :mod:`compiler.weights`,
:mod:`compiler.build` (build, verify, artifacts, running them) and :mod:`compiler.llm`
(decoders). What every role uses stays here: errors, workload keys, targets and their compile
options, partitioning, the prepare path (:mod:`compiler.prepare`, :mod:`compiler.validation`),
task families and the thread pool.

Importing it sizes TVM's CPU thread pool of this process (and of the processes it starts) to the
CPUs it may use (:mod:`compiler.threads`): TVM's own default is half of them on x86.
"""

from compiler.threads import use_usable_cores

use_usable_cores()
