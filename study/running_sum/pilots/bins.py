import json, sys
for name in sys.argv[1:]:
    rows=[json.loads(l) for l in open(f'outputs/pilots/{name}/metrics.jsonl')]
    tr=[r for r in rows if 'acpo/bin0/token_frac' in r or 'acpo/bin4/token_frac' in r]
    shares=[sum((r.get(f'acpo/bin{b}/token_frac') or 0) for r in tr)/len(tr) for b in range(5)]
    L=[r['completions/mean_length'] for r in tr if 'completions/mean_length' in r]
    ml=sum(L)/len(L)
    low=sum(shares[:4])
    end=[r for r in rows if 'train_runtime' in r]
    ba=json.load(open(f'outputs/pilots/{name}/eval_before_after.json'))
    k=[x for x in ba['before'] if 'avg@' in x][0]
    print(name, 'steps', len(tr), 'shares', ' / '.join(f'{100*s:.1f}' for s in shares), f'| bins0-3 {100*low:.1f}% x train mean len {ml:.1f} = {low*ml:.1f} tokens',
          '| runtime', end[0]['train_runtime'] if end else None,
          '| before', {x.split('/')[-1]:round(v,4) for x,v in ba['before'].items()}, '| after', {x.split('/')[-1]:round(v,4) for x,v in ba['after'].items()})
    rew=[r.get('reward') for r in rows if r.get('reward') is not None]
    print('  rollout reward per step', [round(x,3) for x in rew][::16] if rew else None)
