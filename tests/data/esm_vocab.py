"""ESM-2's vocabulary as ESM-2 ships it, and real protein sequences, for the ESM tests."""

#: ESM-2's vocab.txt as fair-esm (esm/constants.py) and every facebook/esm2_* checkpoint ship
#: it (BioNeMo: bionemo-esm2 esm2/data/tokenizer/vocab.txt): written out here, never taken
#: from our constant, so that a wrong order in ours fails.
ESM2_VOCAB_TXT = (
    "<cls>\n<pad>\n<eos>\n<unk>\nL\nA\nG\nV\nS\nE\nR\nT\nI\nD\nP\nK\nQ\nN\nF\nY\nM\nH\nW\nC\n"
    "X\nB\nU\nZ\nO\n.\n-\n<null_1>\n<mask>\n"
)
#: real proteins: human ubiquitin (P0CG48, first copy) and insulin (P01308).
REAL_PROTEINS = [
    "MQIFVKTLTGKTITLEVEPSDTIENVKAKIQDKEGIPPDQQRLIFAGKQLEDGRTLSDYNIQKESTLHLVLRLRGG",
    "MALWMRLLPLLALLALWGPDPAAAFVNQHLCGSHLVEALYLVCGERGFFYTPKTRREAEDLQVGQVELGGGPGAGSLQPLALEGSLQKRGIVEQCCTSICSLYQLENYCN",
]


def synthetic_proteins(count: int, seed: int, max_length: int = 300) -> dict[str, str]:
    """``count`` random proteins ``P0..``: mostly standard residues, a few X B U Z O, lengths 1..max."""
    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.array(list("LAGVSERTIDPKQNFYMHWC" + "XBUZO"))
    weights = np.r_[np.full(20, 0.049), np.full(5, 0.004)]
    weights /= weights.sum()
    lengths = rng.integers(1, max_length + 1, size=count)
    return {f"P{i}": "".join(rng.choice(letters, size=n, p=weights)) for i, n in enumerate(lengths)}
