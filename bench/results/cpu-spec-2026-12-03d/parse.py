import re,sys,statistics as s
def parse(path):
    ts=[];st=[];pr=[];dr=[]
    for l in open(path):
        l=re.sub(r'\x1b\[[0-9;]*m','',l)
        m=re.search(r'(\d\d):(\d\d):([\d.]+)Z.*cpu step tokens=(\d+) drafts=(\d+) propose_ms=([\d.]+) step_ms=([\d.]+)',l)
        if m:
            ts.append(int(m[1])*3600+int(m[2])*60+float(m[3])); dr.append(int(m[5])); pr.append(float(m[6])); st.append(float(m[7]))
    # skip prefill step
    ts,st,pr,dr=ts[1:],st[1:],pr[1:],dr[1:]
    gaps=[(ts[i+1]-ts[i])*1e3-st[i+1] for i in range(len(ts)-1)]
    tok=re.search(r'output tok/s\s+([\d.]+)',open(path).read())
    return dict(steps=len(st),step=s.median(st),propose=s.median(pr),verify=s.median([a-b for a,b in zip(st,pr)]),drafts=s.median(dr),gap=s.median(gaps),gap_mean=s.mean(gaps),toks=float(tok[1]) if tok else 0)
for p in sys.argv[1:]:
    d=parse(p); print(p.split('/')[-1], ' '.join(f'{k}={v:.3f}' if isinstance(v,float) else f'{k}={v}' for k,v in d.items()))
