import numpy as np, lib
C = lib.load_cache(); F = dict(np.load(lib.OUT / "feat.npz"))
ex = lib.extremes(F)
orc = lib.oracle_table(C, ex)
rows = lib.evaluate(C, C["blend"], orc)
for r in rows:
    print(f"{r['cond']:22s} blend {r['bal']:5.1f} ({r['s1']:.1f}/{r['s2']:.1f}/{r['s3']:.1f})  oracle {r['obal']:5.1f} {r['orule']:20s} bal_ok={r['ok_bal']} s2={r['ok_s2'] if r['s2bar'] else 'n/a'}")
print(lib.summary(rows))
