"""The fets round clock: simulated round time and projected convergence score, as the FeTS
2022 challenge computes them.

The per-sample timing profiles (mean, sd in seconds) are the FeTS 2022 challenge's own, derived
from real FeTS institutions (fets_challenge/experiment.py). As there: each collaborator draws a
compute profile (validation + training) and a network profile (download + upload) with
`np.random.seed(0xFEEDFACE)`; every round re-seeds with the round number and, for each
collaborator in order, draws download, n_val·t_val and, for trainers, n_train·s·epochs·t_train,
a second n_val·t_val (validation of the local model) and upload — each draw max(1, N(mean, sd)).
Round time = max over collaborators.

Two details of the challenge code set the scale. Its collaborators are the partition ids read as
text and sorted ('1', '10', '11', ..., '9'), and that order assigns the profiles and orders each
round's draws. Its training "data size" is the length of the training dataset, which for its
GaNDLF loader is the patch queue: s = q_samples_per_volume = 40 patches per subject and epoch,
while validation counts subjects. `samples_per_subject` is s (config
`fets.defaults.timing_samples_per_subject`; docs/faithfulness.md, note F6).

The score uses MAX_SIMULATION_TIME = one week: AUC += best·round_time; projected = (AUC +
(604800 − total_time)·best)/604800, where best is the best Dice of the global models validated
so far. As there, a round's time is paired with the validation of the model the round started
from (the aggregate of the round before, which the collaborators validate as their first task),
so the last aggregate is never scored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MAX_SIMULATION_TIME = 7 * 24 * 60 * 60
PROFILE_SEED = 0xFEEDFACE

TRAINING_TIMES = [
    (6.710741331207654, 0.8726112813698301), (2.7343911917098445, 0.023976155580152165),
    (3.173076923076923, 0.04154320960517865), (6.580379746835443, 0.22461890673025595),
    (3.452046783625731, 0.47136389322749656), (6.090788461700995, 0.08541499003440205),
    (3.206933911159263, 0.1927067498514361), (3.3358208955223883, 0.2950567549663471),
    (4.391304347826087, 0.37464538999161057), (6.324805129494594, 0.1413885448869165),
    (7.415133477633478, 1.1198881747151301), (5.806410256410255, 0.029926699295169234),
    (6.300204918032787, 0.24932319729777577), (5.886317567567567, 0.018627858809133223),
    (5.478184991273998, 0.04902740607167421), (6.32440159574468, 0.15838847558954935),
    (20.661918328585003, 6.085405543890793), (3.197901325478645, 0.07049966132127056),
    (6.523963730569948, 0.2533266757118492), (2.6540077569489338, 0.025503099659276184),
    (1.8025746183640918, 0.06805805332403576),
]  # fmt: skip
VALIDATION_TIMES = [
    (23.129135113591072, 2.5975116854269507), (12.965544041450777, 0.3476297824941513),
    (14.782051282051283, 0.5262660449172765), (16.444936708860762, 0.42613177203005187),
    (15.728654970760235, 4.327559980390658), (12.946098012884802, 0.2449927822869217),
    (15.335950126991456, 1.1587597276712558), (24.024875621890544, 3.087348297794285),
    (38.361702127659576, 2.240113332190875), (16.320970580839827, 0.4995108101783225),
    (30.805555555555554, 3.1836337269688237), (12.100899742930592, 0.41122386959584895),
    (13.099897540983607, 0.6693132795197584), (9.690202702702702, 0.17513593019922968),
    (10.06980802792321, 0.7947848617875114), (14.605333333333334, 0.6012305898922827),
    (36.30294396961064, 9.24123672148819), (16.9130060292851, 0.7452868131028928),
    (40.244078460399706, 3.7700993678269037), (13.161603102779575, 0.1975347910041472),
    (11.222161868549701, 0.7021223062972527),
]  # fmt: skip
DOWNLOAD_TIMES = [
    (112.42869743589742, 14.456734719659513), (117.26870618556701, 12.549951446132013),
    (13.059666666666667, 4.8700489616521185), (47.50220338983051, 14.92128656898884),
    (162.27864210526315, 32.562113378948396), (99.46072058823529, 13.808785580783224),
    (33.6347090909091, 25.00299299660141), (216.25489393939392, 19.176465340447848),
    (217.4117230769231, 20.757673955585453), (98.38857297297298, 13.205048376808929),
    (88.87509473684209, 23.152936862511545), (66.96994262295081, 16.682497150763503),
    (36.668852040816326, 13.759109844677598), (149.31716326530614, 26.018185409516104),
    (139.847, 80.04755583050091), (54.97624444444445, 16.645170929316794),
]  # fmt: skip
UPLOAD_TIMES = [
    (192.28497409326425, 21.537450985376967), (194.60103626943004, 24.194406902237056),
    (20.0, 0.0), (52.43859649122807, 5.047207127169352),
    (182.82417582417582, 14.793519078918195), (143.38059701492537, 7.910690646792151),
    (30.695652173913043, 9.668122350904568), (430.95360824742266, 54.97790476867727),
    (348.3174603174603, 30.14347985347738), (141.43715846994536, 5.271340868190727),
    (158.7433155080214, 64.87526819391198), (81.06086956521739, 7.003461202082419),
    (32.60621761658031, 5.0418315093016615), (281.5388601036269, 90.60338778706557),
    (194.34065934065933, 36.6519776778435), (66.53787878787878, 16.456280602190606),
]  # fmt: skip


@dataclass(frozen=True)
class TimeProfile:
    """(mean, sd) seconds: per validated patient, per trained patient, download, upload."""

    validation: tuple[float, float]
    training: tuple[float, float]
    download: tuple[float, float]
    upload: tuple[float, float]


def time_profiles(names: Sequence[str], seed: int = PROFILE_SEED) -> dict[str, TimeProfile]:
    """One profile per collaborator, drawn as in the FeTS challenge: in the text order of the
    names, which is also the order of the returned dict (so of each round's draws)."""
    rs = np.random.RandomState(seed)
    out = {}
    for name in sorted(str(n) for n in names):
        ml = rs.randint(len(VALIDATION_TIMES))
        net = rs.randint(len(DOWNLOAD_TIMES))
        out[name] = TimeProfile(
            VALIDATION_TIMES[ml], TRAINING_TIMES[ml], DOWNLOAD_TIMES[net], UPLOAD_TIMES[net]
        )
    return out


def round_times(
    profiles: Mapping[str, TimeProfile],
    sizes: Mapping[str, tuple[int, int]],
    trainers: Sequence[str],
    epochs: float,
    fl_round: int,
    samples_per_subject: int,
) -> dict[str, float]:
    """Simulated seconds of every collaborator in round `fl_round` (0-based as in FeTS), drawn
    in the order of `profiles`. `sizes[name]` = (n_train, n_val); a trainer is charged
    n_train·`samples_per_subject`·`epochs` training samples."""
    rs = np.random.RandomState(fl_round)

    def draw(stat: tuple[float, float]) -> float:
        return max(1.0, float(rs.normal(loc=stat[0], scale=stat[1])))

    times = {}
    for name, prof in profiles.items():
        n_train, n_val = sizes[name]
        t = draw(prof.download)
        t += n_val * draw(prof.validation)
        if name in trainers:
            t += n_train * samples_per_subject * epochs * draw(prof.training)
            t += n_val * draw(prof.validation)
            t += draw(prof.upload)
        times[name] = t
    return times


@dataclass
class ConvergenceScore:
    """Running projected convergence score (state kept in checkpoints)."""

    best: float = 0.0
    auc: float = 0.0
    total_time: float = 0.0

    def update(self, score: float, round_time: float) -> float:
        """Add one round: the validation score of the model it started from, and its simulated
        time; returns the projection."""
        self.best = max(self.best, score)
        self.total_time += round_time
        self.auc += self.best * round_time
        return self.projected()

    def projected(self) -> float:
        return (self.auc + (MAX_SIMULATION_TIME - self.total_time) * self.best) / (
            MAX_SIMULATION_TIME
        )
