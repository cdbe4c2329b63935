"""A second answer and a wrong answer for every exercise of the lessons, kept out of them.

SECOND holds answers written apart from the reference solutions: other internal names, and
another algorithm where there is one (brentq for a bisection, a merge for a lookup, loops for
formulas). Each is the whole solution cell as a student would hand it in, the lines the
release keeps around the answer included. WRONG holds, for every exercise, a plausible mistake
(a missing factor, an off-by-one, an unsorted list) that its test must catch.

tests/test_exercise_contract.py checks that both cover every exercise; tests/test_grading_answers.py
grades them through nbgrader.
"""

from __future__ import annotations

from textwrap import dedent


def _(source: str) -> str:
    return dedent(source).strip("\n")


SECOND: dict[str, str] = {}
WRONG: dict[str, str] = {}

# ----------------------------------------------------------------------------- 01 Doc2Vec
SECOND["nb01-ex1"] = _("""
    coarse = {"Artist": "Person", "Athlete": "Person", "OfficeHolder": "Person",
              "Building": "Place", "NaturalPlace": "Place", "Village": "Place",
              "Company": "Organisation", "EducationalInstitution": "Organisation",
              "Animal": "Living thing", "Plant": "Living thing",
              "Album": "Creative work", "Film": "Creative work", "WrittenWork": "Creative work",
              "MeanOfTransportation": "Vehicle"}
    columns = list(CLASSES) + sorted(set(coarse.values()), key=list(coarse.values()).index)

    def targets(labels):
        out = np.zeros((len(labels), len(columns)), dtype=np.int8)
        for row, label in enumerate(labels):
            out[row, label] = 1
            out[row, columns.index(coarse[CLASSES[label]])] = 1
        return out

    Y_train, Y_test = targets(y_train), targets(y_test)
    scaler = StandardScaler().fit(features[BEST]["train"])
    per_column = [LogisticRegression(max_iter=3000).fit(scaler.transform(features[BEST]["train"]),
                                                        Y_train[:, j])
                  for j in range(Y_train.shape[1])]
    x_eval = scaler.transform(features[BEST]["test"])
    votes = [(m.predict_proba(x_eval)[:, 1] >= 0.5) for m in per_column]
    Y_pred = np.column_stack(votes).astype(int)
    micro_f1 = float(f1_score(Y_test, Y_pred, average="micro"))
    subset_acc = float((Y_pred == Y_test).all(axis=1).mean())
""")
WRONG["nb01-ex1"] = SECOND["nb01-ex1"].replace(
    '"MeanOfTransportation": "Vehicle"', '"MeanOfTransportation": "Place"'
)

SECOND["nb01-ex2"] = _("""
    tally = collections.Counter(itertools.chain.from_iterable(d.words for d in train_corpus))
    n_distinct = len(tally)
    vocab_5 = len([token for token, n in tally.items() if n >= 5])
    total = sum(tally.values())
    dropped_share = sum(n for n in tally.values() if n < MIN_COUNT) / total
""")
WRONG["nb01-ex2"] = SECOND["nb01-ex2"].replace(
    "sum(n for n in tally.values() if n < MIN_COUNT) / total",
    "sum(1 for n in tally.values() if n < MIN_COUNT) / len(tally)",  # of the vocabulary
)

SECOND["nb01-ex3"] = _("""
    learned = models["PV-DM"].dv
    x_dv = np.stack([learned.get_vector(i) for i in range(len(train_corpus))])
    dv_clf = fit_logreg(x_dv, features["PV-DM"]["dev"])[0]
    dv_test_acc = float(np.mean(dv_clf.predict(features["PV-DM"]["test"]) == y_test))
""")
WRONG["nb01-ex3"] = _("""
    x_dv = features["PV-DM"]["train"]
    dv_clf = fit_logreg(x_dv, features["PV-DM"]["dev"])[0]
    dv_test_acc = float(np.mean(dv_clf.predict(features["PV-DM"]["test"]) == y_test))
""")

SECOND["nb01-ex4"] = _("""
    knn = KNeighborsClassifier(10, metric="cosine")
    knn.fit(features[BEST]["train"], y_train)
    knn_acc = float((knn.predict(features[BEST]["test"]) == y_test).mean())
""")
WRONG["nb01-ex4"] = SECOND["nb01-ex4"].replace('metric="cosine"', 'metric="euclidean"')

# ----------------------------------------------------------------------------- 02 logistic regress
SECOND["nb02-ex1"] = _("""
    class InverseTime(keras.optimizers.schedules.LearningRateSchedule):
        def __init__(self, initial, rate, every):
            super().__init__()
            self.initial, self.rate, self.every = float(initial), float(rate), every

        def __call__(self, step):
            t = tf.cast(step, tf.float32)
            return tf.math.divide(self.initial, 1.0 + self.rate * t / self.every)

        def get_config(self):
            return dict(initial=self.initial, rate=self.rate, every=self.every)
""")
WRONG["nb02-ex1"] = SECOND["nb02-ex1"].replace(
    "self.rate * t / self.every", "self.rate * tf.floor(t / self.every)"
)

SECOND["nb02-ex2"] = _("""
    def trained_norm(lam):
        mdl = logreg.SoftmaxRegression(N_FEATURES, N_CLASSES, l2=lam, device=DEVICE)
        logreg.train(mdl, splits, keras.optimizers.schedules.ExponentialDecay(LR0, 100, 0.96),
                     epochs=GRID_EPOCHS, batch_size=BATCH_SIZE, seed=SEED, progress=False)
        return float(np.sqrt(np.sum(np.square(mdl.w.numpy()))))

    w_norms = {lam: trained_norm(lam) for lam in (0.0, 0.01)}
""")
WRONG["nb02-ex2"] = SECOND["nb02-ex2"].replace(
    "{lam: trained_norm(lam) for lam in (0.0, 0.01)}",
    "{0.0: trained_norm(0.01), 0.01: trained_norm(0.0)}",
)

SECOND["nb02-ex3"] = _("""
    keras.utils.set_random_seed(SEED + 7)
    keras_model = keras.Sequential([
        keras.layers.Input(shape=(N_FEATURES,)),
        keras.layers.Dense(units=N_CLASSES, kernel_regularizer=keras.regularizers.L2(l2=L2)),
    ])
    keras_model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=keras.optimizers.schedules.ExponentialDecay(
            LR0, decay_steps=100, decay_rate=0.96)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, name="xent"),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    x_tr, y_tr = splits["train"]
    keras_model.fit(x_tr, y_tr, batch_size=BATCH_SIZE, epochs=GRID_EPOCHS, verbose=0)
    x_te, y_te = splits["test"]
    keras_acc = float(np.mean(np.argmax(keras_model.predict(x_te, verbose=0), axis=1) == y_te))
""")
WRONG["nb02-ex3"] = SECOND["nb02-ex3"].replace(
    ", kernel_regularizer=keras.regularizers.L2(l2=L2)", ""
)

# ----------------------------------------------------------------------------- 03 optimizers
SECOND["nb03-ex1"] = _("""
    f_quad, x0, _ = FUNCTIONS["quadratic"]
    start_loss = float(f_quad(tf.constant(x0, tf.float64)))
    low, high = 0.01, 0.2
    while high - low > 1e-4:
        probe = 0.5 * (low + high)
        _, final_loss, diverged = run_2d("momentum", probe, f_quad, x0, steps=200)
        if diverged or not final_loss < start_loss:
            high = probe
        else:
            low = probe
    lr_threshold = low
""")
WRONG["nb03-ex1"] = _("""
    lr_threshold = 2 / 50  # gradient descent's threshold, not momentum's
""")

SECOND["nb03-ex2"] = _("""
    def zero_share_and_acc(l1):
        config.set_seed(SEED)
        net = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10)])
        opt = make_optimizer("proximal_gd", 0.5, l1=l1)
        h = train_loop(net, opt, make_loss("sparse_softmax_ce"),
                  (x_train, y_train), (x_dev, y_dev), epochs=1, batch_size=BATCH)
        k = net.layers[-1].kernel.numpy()
        return float(np.count_nonzero(k == 0) / k.size), float(h["eval_acc"][-1])

    zeros_plain, acc_plain = zero_share_and_acc(0.0)
    zeros_l1, acc_l1 = zero_share_and_acc(1e-3)
""")
WRONG["nb03-ex2"] = SECOND["nb03-ex2"].replace(
    'make_optimizer("proximal_gd", 0.5, l1=l1)', 'make_optimizer("gd", 0.5)'
)

SECOND["nb03-ex3"] = _("""
    config.set_seed(SEED + 1)
    layers = [keras.Input((784,))]
    layers += [keras.layers.Dense(width, activation="relu") for width in (256, 128)]
    net = keras.Sequential(layers + [keras.layers.Dense(10)])
    train_loop(net, make_optimizer("adam", 1e-3), make_loss("sparse_softmax_ce"),
          (x_train, y_train), (x_test, y_test), batch_size=BATCH, epochs=1)
    test_pred = np.asarray(net(x_test, training=False)).argmax(axis=1)
    kappa_sklearn = float(cohen_kappa_score(y_test, test_pred, weights="quadratic"))
    kappa_loss = WeightedKappaLoss(10, epsilon=0)(keras.ops.one_hot(y_test, 10),
                                                  keras.ops.one_hot(test_pred, 10))
    kappa_from_loss = 1 - math.exp(float(kappa_loss))
""")
WRONG["nb03-ex3"] = SECOND["nb03-ex3"].replace(
    "keras.ops.one_hot(test_pred, 10))", "keras.ops.softmax(net(x_test, training=False)))"
)

SECOND["nb03-ex4"] = _("""
    f_rosen, x0, _ = FUNCTIONS["rosenbrock"]

    def final_loss(beta):
        xy = tf.Variable(x0, dtype=tf.float64)
        optimizer = make_optimizer("momentum", 1e-3, momentum=beta)
        for _ in range(STEPS_2D):
            with tf.GradientTape() as recorder:
                value = f_rosen(xy)
            optimizer.apply_gradients(zip([recorder.gradient(value, xy)], [xy]))
        return float(f_rosen(xy))

    rosen_by_momentum = {beta: final_loss(beta) for beta in (0.5, 0.8, 0.95, 0.99)}
""")
WRONG["nb03-ex4"] = SECOND["nb03-ex4"].replace(
    "{beta: final_loss(beta)", "{str(beta): final_loss(beta)"
)

# ----------------------------------------------------------------------------- 04 MirroredStrategy
SECOND["nb04-ex1"] = _("""
    def lenet_under(n):
        with mirrored.strategy_over(DEVICES[:n]).scope():
            net = build("lenet", (28, 28, 1), 10, SEED)
            xent = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            net.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss=xent)
        return net

    m1, m2 = lenet_under(1), lenet_under(min(2, len(DEVICES)))
    start = m1.get_weights()
    m2.set_weights(start)
    for net in (m1, m2):
        net.fit(x_train[:64], y_train[:64], batch_size=64, epochs=1, shuffle=False, verbose=0)
    after1, after2 = m1.get_weights(), m2.get_weights()
    max_diff = float(max(np.max(np.abs(a - b)) for a, b in zip(after1, after2)))
    moved = float(max(np.max(np.abs(a - b)) for a, b in zip(after1, start)))
""")
WRONG["nb04-ex1"] = SECOND["nb04-ex1"].replace("zip(after1, start)", "zip(after1, after2)")

SECOND["nb04-ex2"] = _("""
    single = timing.loc[timing.replicas == 1, ["batch", "examples/s"]]
    merged = timing.merge(single.rename(columns={"examples/s": "alone"}), on="batch", how="left")
    timing["efficiency"] = (merged["examples/s"] / merged["alone"] / merged["replicas"]).to_numpy()
    ranked = timing[timing.replicas > 1].sort_values("efficiency", ascending=False, kind="stable")
    most_efficient = (int(ranked.iloc[0]["replicas"]), int(ranked.iloc[0]["batch"]))
""")
WRONG["nb04-ex2"] = SECOND["nb04-ex2"].replace(' / merged["replicas"]', "")

SECOND["nb04-ex3"] = _("""
    def warmup_cosine(step, peak, warmup_steps, decay_steps):
        if step <= warmup_steps:
            return peak * step / warmup_steps if warmup_steps else peak
        done = min(step - warmup_steps, decay_steps)
        return 0.5 * peak * (1.0 + math.cos(math.pi * done / decay_steps))

    print([round(warmup_cosine(s, 0.32, 10, 40), 4) for s in (0, 5, 10, 30, 50)])
""")
WRONG["nb04-ex3"] = SECOND["nb04-ex3"].replace(
    "0.5 * peak * (1.0 + math.cos(", "peak * (1.0 + math.cos("
)

SECOND["nb04-ex4"] = _("""
    sqrt_rate = BASE_LR * K ** 0.5
    sqrt_run = run_config(
        "exercise-sqrt-rule", TRAIN_REPLICAS, [BIG_BATCH for _ in range(SCALING_EPOCHS)],
        n=SCALING_N,
        optimizer=keras.optimizers.SGD(learning_rate=warmup(sqrt_rate, steps_per_epoch),
                                       momentum=0.9),
    )
    acc_sqrt = float(sqrt_run["test_acc"][-1])
""")
WRONG["nb04-ex4"] = SECOND["nb04-ex4"].replace(
    "[BIG_BATCH for _ in range(SCALING_EPOCHS)]", "[BASE_BATCH for _ in range(SCALING_EPOCHS)]"
)

# ----------------------------------------------------------------------------- 05 parameter server
SECOND["nb05-ex1"] = _("""
    def may_step(clock, live_clocks, s):
        if len(live_clocks) == 0:
            return True
        return clock <= min(live_clocks) + s

    recorded = runlogs.steps(runs["ssp s=3", 2])["gap"]
    refused = sum(1 for g in recorded if not may_step(int(g), [0], 1))
""")
WRONG["nb05-ex1"] = SECOND["nb05-ex1"].replace(
    "clock <= min(live_clocks) + s", "clock < min(live_clocks) + s"
)

SECOND["nb05-ex2"] = _("""
    def ps_traffic(n_params, steps, header=32):
        per_pull = n_params * np.dtype(np.float32).itemsize
        return steps * per_pull, steps * (per_pull + header)

    lenet_sent, lenet_received = ps_traffic(61_706, 16 * 1_000)
    lenet_mb = (lenet_sent + lenet_received) / 1e6
    out_per_s, in_per_s = ps_traffic(61_706, 1 / 0.005)
    max_workers = int(np.floor(1.25e9 / max(out_per_s, in_per_s)))
""")
WRONG["nb05-ex2"] = SECOND["nb05-ex2"].replace("steps * (per_pull + header)", "steps * per_pull")

SECOND["nb05-ex3"] = _("""
    def downpour_traffic(steps, n_fetch, n_push, pull_bytes, push_bytes):
        fetches = sum(1 for k in range(steps) if k % n_fetch == 0)
        pushes = sum(1 for k in range(1, steps + 1) if k % n_push == 0)
        return pull_bytes * fetches, push_bytes * pushes
""")
WRONG["nb05-ex3"] = SECOND["nb05-ex3"].replace(
    "sum(1 for k in range(steps) if k % n_fetch == 0)", "steps // n_fetch"
)

# ----------------------------------------------------------------------------- 06 stragglers
SECOND["nb06-ex1"] = _("""
    def best_k(step_times):
        ordered = sorted(float(t) for t in step_times)
        best, best_rate = 1, -1.0
        for k, slowest in enumerate(ordered, start=1):
            if k / slowest > best_rate:
                best, best_rate = k, k / slowest
        return best

    sync_run = runs[SEEDS[0], slow_profile, "sync"]
    wt = runlogs.worker_times(sync_run)
    n_steps = runlogs.steps(sync_run).groupby("worker").size()
    k_measured = best_k(((wt.compute_s + wt.delay_s) / n_steps).values)
""")
WRONG["nb06-ex1"] = SECOND["nb06-ex1"].replace(
    "sorted(float(t) for t in step_times)", "[float(t) for t in step_times]"
)

SECOND["nb06-ex2"] = _("""
    from scipy.optimize import brentq

    beta_max = brentq(lambda beta: spectral_radius(2.0, 0.4, [beta]) - 1.0, 0.01, 2.0, xtol=1e-8)
""")
WRONG["nb06-ex2"] = _("""
    beta_max = 0.4  # the quadratic's sufficient condition, not the boundary
""")

SECOND["nb06-ex3"] = _("""
    def my_fold_weights(ages, fresh_weight, decay, bound):
        w = np.array([fresh_weight * decay ** a for a in ages], dtype=float)
        limit = bound * fresh_weight
        if w.sum() > limit:
            w = w * (limit / w.sum())
        return w.tolist()

    fold_run = folds[SEEDS[0], 0.5][0]
    recorded = runlogs.updates(fold_run)
    diffs = [0.0]
    for fresh, ages, applied in zip(recorded.fresh, recorded.staleness, recorded.weights):
        stale = [i for i, f in enumerate(fresh) if not f]
        mine = my_fold_weights([ages[i] for i in stale], 1.0, fold_run.config.decay,
                               fold_run.config.fold_bound)
        diffs += [abs(m - applied[i]) for m, i in zip(mine, stale)]
    max_diff = max(diffs)
""")
WRONG["nb06-ex3"] = SECOND["nb06-ex3"].replace("limit = bound * fresh_weight", "limit = bound")

# ----------------------------------------------------------------------------- 07 fault tolerance
SECOND["nb07-ex1"] = _("""
    log = resumed.events.sort_values("t")
    crash = log[(log.kind == "fault") & log.source.str.startswith("ps")].iloc[0]
    before = log[(log.kind == "checkpoint") & (log.t <= crash.t)]
    redo_s = float(crash.t - before.t.iloc[-1])
    after = log[(log.kind == "update") & (log.t > crash.t)]
    down_s = float(after.t.iloc[0] - crash.t)
""")
WRONG["nb07-ex1"] = SECOND["nb07-ex1"].replace(
    '(log.kind == "update") & (log.t > crash.t)', '(log.kind == "resume") & (log.t > crash.t)'
)

SECOND["nb07-ex2"] = _("""
    def young_interval(c_seconds, mtbf_seconds):
        import math
        return math.sqrt(2.0 * c_seconds * mtbf_seconds)

    print(f"{young_interval(2, 24 * 3600) / 60:.1f} min between checkpoints")
""")
WRONG["nb07-ex2"] = SECOND["nb07-ex2"].replace("2.0 * c_seconds", "c_seconds")

SECOND["nb07-ex3"] = _("""
    events = survived["async"].events
    fault_t = events.loc[events.kind == "fault", "t"].min()
    later = events[(events.kind == "step") & (events.t > fault_t)]
    after_fault = {int(w): int((later.worker == w).sum()) for w in later.worker.unique()}
""")
WRONG["nb07-ex3"] = SECOND["nb07-ex3"].replace("(events.t > fault_t)", "(events.t < fault_t)")

# ----------------------------------------------------------------------------- 08 TF's strategies
SECOND["nb08-ex1"] = _("""
    def ring_seconds(grad_bytes, n, latency_s, bytes_per_s):
        rounds = 2 * (n - 1)  # reduce-scatter, then all-gather
        return rounds * latency_s + rounds * (grad_bytes / n) / bytes_per_s

    def tree_seconds(grad_bytes, n, latency_s, bytes_per_s):
        depth = 0
        while 2 ** depth < n:
            depth += 1
        return 2 * depth * (latency_s + grad_bytes / bytes_per_s)

    ring_faster_up_to = {}
    for gradient in (4, G, 400e6):
        best = 2
        for n in range(2, 1025):
            if ring_seconds(gradient, n, 5e-5, 1.25e9) <= tree_seconds(gradient, n, 5e-5, 1.25e9):
                best = n
        ring_faster_up_to[gradient] = best
""")
WRONG["nb08-ex1"] = SECOND["nb08-ex1"].replace(
    "rounds * (grad_bytes / n) / bytes_per_s", "rounds * grad_bytes / bytes_per_s"
)

SECOND["nb08-ex2"] = _("""
    lowest = sweep["train_loss"].min()
    qualifying = {b: sweep.loc[b, "time_s"] for b in sweep.index
                  if sweep.loc[b, "train_loss"] <= 2 * lowest}
    for b, seconds in qualifying.items():
        print(f"batch {b}: {seconds:.2f} s, training loss {sweep.loc[b, 'train_loss']:.4f}")
    best_batch = int(min(qualifying, key=qualifying.get))
""")
WRONG["nb08-ex2"] = _("""
    good = sweep.train_loss <= 2 * sweep.train_loss.min()
    best_batch = int(sweep.time_s[good].argmin())  # a position among the rows, not a batch size
""")

SECOND["nb08-ex3"] = _("""
    hosts = {"chief": [2000], "worker": [2001, 2002], "ps": [2003]}
    spec = {"cluster": {job: [f"localhost:{p}" for p in ports] for job, ports in hosts.items()}}
    spec["task"] = dict(type="worker", index=1)
    my_tf_config = json.dumps(spec)
""")
WRONG["nb08-ex3"] = SECOND["nb08-ex3"].replace("index=1", "index=2")

SECOND["nb08-ex4"] = _("""
    def per_replica_batch(global_batch, workers):
        share, rest = divmod(global_batch, workers)
        if rest:
            raise ValueError(f"{global_batch} examples do not split evenly over {workers} workers")
        return share

    per_replica_batch(BATCH - BATCH % 3, 3)
""")
WRONG["nb08-ex4"] = _("""
    def per_replica_batch(global_batch, workers):
        return global_batch // workers

    per_replica_batch(BATCH - BATCH % 3, 3)
""")

# ----------------------------------------------------------------------------- 09 Past the laptop
SECOND["nb09-ex1"] = _("""
    step_costs = with_costs(cal, cores=None, compute_s=11 * ps_work)
    one_worker_rate = 1.0 / (step_costs.compute_s + ps_work)  # requests/s from one worker
    knee_pred = 1
    while knee_pred * one_worker_rate < 0.9 * ps_max:
        knee_pred += 1
    knee_sim = None
    for workers in range(1, 25):
        run = simulate(run_config(mode="async", workers=workers, steps=2000), step_costs)
        if run.updates / run.seconds >= 0.9 * ps_max:
            knee_sim = workers
            break
""")
WRONG["nb09-ex1"] = SECOND["nb09-ex1"].replace(
    "1.0 / (step_costs.compute_s + ps_work)", "1.0 / step_costs.compute_s"
)

SECOND["nb09-ex2"] = _("""
    import math

    def expected_round(n, base_s, mean_s):
        harmonic = math.fsum(1.0 / k for k in range(1, n + 1))
        return base_s + harmonic * mean_s

    delays = {w: {"dist": "exponential", "mean": 0.004} for w in range(50)}
    two = run_config(mode="sync", workers=50, steps=2, stragglers=delays)
    second = []
    for seed in range(200):
        first, then = simulate(two, Costs(compute_s=0.002), seed=seed).update_t[:2]
        second.append(then - first)
    sim_round = float(sum(second) / len(second))
""")
WRONG["nb09-ex2"] = _("""
    def expected_round(n, base_s, mean_s):
        return base_s + n * mean_s  # every worker's delay in turn, as if they added up

    delays = {w: {"dist": "exponential", "mean": 0.004} for w in range(50)}
    two = run_config(mode="sync", workers=50, steps=2, stragglers=delays)
    sim_round = sum(
        simulate(two, Costs(compute_s=0.002), seed=s).seconds / 2 for s in range(200)
    ) / 200
""")

SECOND["nb09-ex3"] = _("""
    def predicted_staleness(n):
        # in each round the i-th push (i = 0 .. n-1) follows i others: the mean of 0 .. n-1
        return sum(range(n)) / n

    run8 = simulate(run_config(mode="async", workers=8, steps=1200, seed=2), Costs(compute_s=0.004))
    sim_staleness_8 = float(run8.staleness.mean())
""")
WRONG["nb09-ex3"] = _("""
    def predicted_staleness(n):
        return n - 1  # the last push of a round, not the mean

    sim_staleness_8 = simulate(
        run_config(mode="async", workers=8, steps=1000), Costs(compute_s=0.004)
    ).mean_staleness
""")
