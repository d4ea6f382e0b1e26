import json,sys,statistics as st,collections
rows=collections.defaultdict(list); loads=[]
for l in open(sys.argv[1]):
    d=json.loads(l); r=d['report']; loads.append(float(d['load']))
    rows[(d['name'],d.get('bin','branch'))].append((r['output_tok_s'], r.get('spec_accepted_tokens',0), r.get('spec_draft_tokens',0)))
names=[]
for (n,b) in rows:
    if n not in names: names.append(n)
def med(n,b): 
    v=rows.get((n,b)); return st.median([x[0] for x in v]) if v else None
print('load', min(loads), max(loads))
for n in names:
    off=n.rsplit('_',1)[0]+'_off' if not n.endswith('_off') else None
    if n.startswith('single_greedy_draft'): off='single_greedy_off'
    if n.startswith('single_t07_draft'): off='single_t07_off'
    out=[n]
    for b in ['main','branch']:
        m=med(n,b)
        if m is None: continue
        s=f'{b} {m:.0f}'
        if off and not n.endswith('_off'):
            o=med(off,b); s+=f' ({m/o:.2f}x)'
        s+=' all=['+','.join(f'{x[0]:.0f}' for x in rows[(n,b)])+']'
        if b=='branch' and rows[(n,b)][0][2]: s+=' acc/prop '+','.join(f'{x[1]}/{x[2]}' for x in rows[(n,b)][:4])
        out.append(s)
    print(' | '.join(out))
