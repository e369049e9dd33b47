"""lm-eval task configs for the evaluation sets shipped under ``calib/eval`` (``--tasks diffquant_hellaswag``).

``python -m diffquant.lmeval`` passes this folder as ``--include_path``; from Python, use
``lm_eval.tasks.TaskManager(include_path=diffquant.lmeval.TASKS_DIR)``. Each YAML's ``custom_dataset`` is a
loader in :mod:`diffquant.lmeval_tasks.loaders`, which reads the items exactly as :func:`diffquant.tasks.load_task`
does (nothing is downloaded), so lm-eval's scores equal :func:`diffquant.evaluate.evaluate_task`'s.
"""
