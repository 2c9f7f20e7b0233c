source bench/device_env.sh
python3 - <<'PY'
import os, subprocess, sys, time, statistics as st
code = "import trainforge.cli, trainforge.config, trainforge.driver.launch, trainforge.driver.cluster, trainforge.tracking.driver, ray"
base = os.environ["PYTHONPATH"]
envs = {
    "baseline_first": {**os.environ, "PYTHONPATH": ".base25:" + base},
    "new_last": dict(os.environ),
    "new_first": {**os.environ, "PYTHONPATH": "/tmp/tf:" + base},
}
times = {k: [] for k in envs}
for i in range(8):
    for name, env in envs.items():
        t = time.perf_counter(); subprocess.run([sys.executable, "-c", code], env=env, check=True)
        times[name].append(round(time.perf_counter() - t, 3))
for name, v in times.items():
    print(name, "median", st.median(v), v)
out = subprocess.run([sys.executable, "-c", "import trainforge, ray; print(trainforge.__file__)"], env=envs["baseline_first"], capture_output=True, text=True)
print(out.stdout, out.stderr[-500:])
PY
