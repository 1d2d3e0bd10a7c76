import sys, pickle, lib
d = pickle.load(open(sys.argv[1], "rb"))
rows = d["rows"] if isinstance(d, dict) else d
for r in rows:
    print(f"{r['cond']:22s} {r['bal']:5.1f} ({r['s1']:5.1f}/{r['s2']:5.1f}/{r['s3']:5.1f}) oracle {r['obal']:5.1f} short {r['short']:+5.1f} {'BAR' if r['ok_bal'] and r['ok_s2'] else ''} {'' if r['ok_s2'] else 'S2miss'}")
