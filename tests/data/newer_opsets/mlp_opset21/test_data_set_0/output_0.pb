
BlogitsJ(*‹>ÁxÀSÅ½YÀ`}…¿\yž@Äaô?GRrÀC]¾Å%Ö>