import os, sys, time, threading, statistics, pyarrow as pa, pyarrow.parquet as pq
t = pq.read_table(os.path.join(os.path.dirname(__file__), "part.parquet"))
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
print("pyarrow", pa.__version__, "cpu_count", pa.cpu_count(), "io", pa.io_thread_count(), "python", sys.version.split()[0])

def pyfile(p, sync):
    with open(p, "wb") as f:
        pq.write_table(t, f)
        f.flush()
        if sync: os.fsync(f.fileno())

def buffer(p, sync):
    sink = pa.BufferOutputStream(); pq.write_table(t, sink); data = sink.getvalue().to_pybytes()
    with open(p, "wb") as f:
        f.write(data); f.flush()
        if sync: os.fsync(f.fileno())

def path(p, sync):
    pq.write_table(t, p)

def serialize_only(p, sync):
    sink = pa.BufferOutputStream(); pq.write_table(t, sink)

def bench(label):
    for fn in (pyfile, buffer, path, serialize_only):
        for sync in (False, True):
            times = []
            for i in range(15):
                s = time.perf_counter(); fn(os.path.join(d, f"x{i}.parquet"), sync); times.append(time.perf_counter() - s)
            print(f"{label:12s} {fn.__name__:15s} fsync={sync!s:5s} median {1e3*statistics.median(times):8.2f} ms max {1e3*max(times):8.2f} ms")

bench("idle")
stop = False
def spin():
    x = 0
    while not stop: x += 1
ths = [threading.Thread(target=spin) for _ in range(2)]
[th.start() for th in ths]
bench("2 spinners")
ths2 = [threading.Thread(target=spin) for _ in range(8)]
[th.start() for th in ths2]
bench("10 spinners")
stop = True
[th.join() for th in ths + ths2]
pa.set_cpu_count(1); pa.set_io_thread_count(1)
bench("1 thread")
