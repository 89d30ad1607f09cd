"""What the probes share: a copy of a source tree's include/ and bench/ to patch, exact
patches that fail loudly when the code they mark has moved, and the sm_90 build of one
benchmark from the patched copy (the probes run the patched build on the GPU)."""
import os, shutil, subprocess, sys


def copy_tree(argv, default_out):
    """(source tree, output folder) from argv[1:3]; include/ and bench/ copied afresh."""
    src = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), '..', '..'))
    out = os.path.abspath(argv[2] if len(argv) > 2 else default_out)
    shutil.rmtree(out, ignore_errors=True)
    for d in ('include', 'bench'):
        shutil.copytree(os.path.join(src, d), os.path.join(out, d))
    return src, out


def start(argv, probe):
    """A probe's copy of the tree (copy_tree, default output /tmp/<probe>) and its `patch`
    function: patch(path, edits) on that copy, failing with the probe's name."""
    src, out = copy_tree(argv, '/tmp/' + probe)
    return src, out, lambda path, edits: patch(out, path, edits, probe)


def patch(out, path, edits, probe):
    """Replaces each `old` by `new` in out/path; every `old` must occur exactly once."""
    p = os.path.join(out, path)
    s = open(p).read()
    for old, new in edits:
        if s.count(old) != 1:
            sys.exit(f'{probe}: expected exactly one of these in {path}:\n{old}')
        s = s.replace(old, new, 1)
    open(p, 'w').write(s)


def add_timer_trace(out, probe, array, size, extra=''):
    """Declares `__device__ unsigned long long <array>[size]` and `probe_now()` (the global
    timer, ns) in namespace dhisparse::detail at the top of resolve's common.cuh, followed by
    `extra` (the probe's macros)."""
    trace = f'''
__device__ unsigned long long {array}[{size}];
DHISPARSE_DEVICE DHISPARSE_FORCEINLINE unsigned long long probe_now()
{{
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}}
''' + extra
    patch(out, 'include/dhisparse/detail/resolve/common.cuh', [('#if defined(__CUDACC__)\n', '#if defined(__CUDACC__)\n' + trace)],
          probe)


def build(out, source, exe_name):
    """Builds bench/<source> of the patched copy into out/<exe_name>; returns its path."""
    nvcc = os.environ.get('NVCC', '/usr/local/cuda/bin/nvcc')
    obj, exe = os.path.join(out, exe_name + '.o'), os.path.join(out, exe_name)
    subprocess.check_call([nvcc, '-I' + os.path.join(out, 'include'), '-I' + os.path.join(out, 'bench'), '-O3',
                           '-DNDEBUG', '--generate-code=arch=compute_90,code=[compute_90,sm_90]',
                           '--expt-relaxed-constexpr', '-std=c++17', '-x', 'cu', '-c',
                           os.path.join(out, 'bench', source), '-o', obj])
    subprocess.check_call(['g++', obj, '-o', exe, '-lcudadevrt', '-lcudart_static', '-lrt', '-lpthread', '-ldl',
                           '-L/usr/local/cuda/targets/x86_64-linux/lib'])
    return exe
